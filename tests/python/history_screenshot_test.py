#!/usr/bin/python3
"""The page `history.py html` writes, opened in headless Chromium with no network, and its
screenshot checked to hold the charts: one frame per case key (found by the frame colour only the
plot areas use), ink in every plot, both devices' series colours in each, and the verdict red in
the chart of the planted slowdown alone. Exit 0 passed, 1 failed, 77 skipped where Chromium (Debian's
`chromium`, scripts/setup.sh --test-tools installs it) cannot start, with the reason on one line.

    history_screenshot_test.py [--keep DIR]   (DIR keeps the page and the screenshot)
"""

import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fixtures as fx  # noqa: E402
import test_history as th  # noqa: E402

sys.path.insert(0, fx.SCRIPTS)
import history_page  # noqa: E402

SKIP = 77
WINDOW = (1280, 4000)   # tall enough for the 28 charts of the synthetic history, 3 a row


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(SKIP)


def fail(reason):
    print(f"FAILED: {reason}")
    sys.exit(1)


def rgb(hex_colour):
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    skip("no chromium on PATH (scripts/setup.sh --test-tools installs Debian's chromium)")


def screenshot(browser, page, png, profile):
    """Chromium renders page into png; no route out: a proxy on a closed port, names unresolvable."""
    command = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--hide-scrollbars", "--no-first-run", "--force-device-scale-factor=1",
               f"--window-size={WINDOW[0]},{WINDOW[1]}", "--proxy-server=127.0.0.1:9",
               "--host-resolver-rules=MAP * ~NOTFOUND", f"--user-data-dir={profile}",
               f"--screenshot={png}", "file://" + page]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "timed out after 120 s"
    if proc.returncode != 0 or not os.path.exists(png):
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"exit {proc.returncode}: {last}"
    return None


def main():
    keep = sys.argv[2] if len(sys.argv) > 2 and sys.argv[1] == "--keep" else None
    try:
        import numpy as np
        from PIL import Image
        from scipy import ndimage
    except ImportError as e:
        skip(f"{e.name} is missing (scripts/setup.sh installs python3-pil, python3-numpy, python3-scipy)")
    browser = chromium()
    with tempfile.TemporaryDirectory() as tmp:
        # Chromium must render a trivial page first: where it cannot, the test cannot run (skip);
        # where it can, a page it cannot render is a failure.
        blank = os.path.join(tmp, "blank.html")
        with open(blank, "w", encoding="utf-8") as f:
            f.write("<!DOCTYPE html><title>x</title><p>x</p>")
        if why := screenshot(browser, blank, os.path.join(tmp, "blank.png"), os.path.join(tmp, "profile")):
            skip(f"headless chromium cannot start here: {why}")

        paths, planted, device_a, device_b = th.write_synthetic_history(tmp)
        history = os.path.join(tmp, "history.jsonl")
        page = os.path.join(keep or tmp, "history-page.html")
        png = os.path.join(keep or tmp, "history-page.png")
        for args in (["add", "--history", history, *paths], ["html", "--history", history, "-o", page]):
            proc = fx.run_script("history.py", *args)
            if proc.returncode != 0:
                fail(f"history.py {args[0]}: {proc.stderr.strip()}")
        with open(page, encoding="utf-8") as f:
            charts = th.Page(f.read()).charts
        if why := screenshot(browser, page, png, os.path.join(tmp, "profile")):
            fail(f"chromium did not render the page: {why}")
        image = np.asarray(Image.open(png).convert("RGB")).astype(int)

    if len(np.unique(image.reshape(-1, 3), axis=0)) < 50:
        fail("the screenshot is nearly blank")
    frames, count = ndimage.label(np.all(image == rgb(history_page.FRAME_COLOUR), axis=2), np.ones((3, 3)))
    width = history_page.RIGHT - history_page.LEFT + 1
    height = history_page.BOTTOM - history_page.TOP + 1
    boxes = [box for box in ndimage.find_objects(frames)
             if abs(box[1].stop - box[1].start - width) <= 2 and abs(box[0].stop - box[0].start - height) <= 2]
    if len(boxes) != len(charts):
        fail(f"{len(boxes)} chart frames in the screenshot ({count} frame-coloured shapes), "
             f"{len(charts)} charts (case keys) in the page")
    # The page's order: rows top to bottom, left to right in a row.
    boxes.sort(key=lambda b: (b[0].start // 50, b[1].start))
    colour_a, colour_b = (rgb(c) for c in history_page.PALETTE[:2])
    red = rgb(history_page.VERDICT_COLOUR["SLOWER"])

    def near(pixels, colour):
        return int((np.abs(pixels - colour).sum(axis=2) < 60).sum())

    for box, chart in zip(boxes, charts):
        inside = image[box[0].start + 2:box[0].stop - 2, box[1].start + 2:box[1].stop - 2]
        ink = int((inside.sum(axis=2) < 3 * 235).sum())
        found = {"ink": ink, "device A": near(inside, colour_a), "device B": near(inside, colour_b),
                 "red": near(inside, red)}
        slowed = chart["case"] == planted
        if ink < 300 or found["device A"] < 30 or found["device B"] < 30 or (found["red"] >= 20) != slowed:
            fail(f"chart '{chart['case']}': {found} (expected ink, both series"
                 f"{', and the SLOWER red' if slowed else ', no red'})")
    print(f"passed: {len(boxes)} charts rendered, each with both devices' series; "
          f"the SLOWER marker in '{planted}' only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
