"""How big a run's report page is and how long it takes to show in a browser (docs/report.md, "Size and speed").

    python bench/report_page.py runs/<run>/report.html [--loads 3]

Opens the page in Debian's Chromium (headless, Playwright, every request off the machine refused) a few times
and prints, for each load, the browser's load event and the moment BokehJS says its charts' document is idle,
both in ms from the navigation's start; then any console error and any request that was refused.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
DRAWN = "window.grpoSeries && grpoSeries().length && grpoSeries().every(s => s.drawn)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("page", type=Path)
    parser.add_argument("--loads", type=int, default=3)
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    print(f"{args.page}: {args.page.stat().st_size:,} bytes")
    refused, errors, idle = [], [], []
    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        context = playwright.chromium.launch_persistent_context(
            profile, executable_path=args.chromium, args=ARGS, headless=True, viewport={"width": 1500, "height": 1000})
        context.route("**/*", lambda route: route.continue_() if route.request.url.startswith(("file:", "about:"))
                      else (refused.append(route.request.url), route.abort()))
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else
                "document idle at" in m.text and idle.append(m.text.split("idle at ")[1]))
        for _ in range(args.loads):
            page.goto(args.page.resolve().as_uri())
            page.wait_for_function(DRAWN, timeout=60_000)
            page.wait_for_timeout(300)  # BokehJS logs "document idle" just after the last chart is drawn
            load = page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd")
            print(f"load event at {load:.0f} ms, charts idle at {idle[-1] if idle else '?'}")
        context.close()
    print(f"console errors: {errors or 'none'}; requests refused: {refused or 'none'}")


if __name__ == "__main__":
    main()
