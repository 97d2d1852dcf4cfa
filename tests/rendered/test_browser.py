"""The built pages as a reader sees them: opened in headless Chromium, offline, with their scripts run.

`make test` runs this after `make html`. Each page of the table of contents is opened from file:// (no
server, no network: the book must work from a copy on disk), Chromium runs the page's scripts until they
are idle, and the test reads the resulting DOM. MathJax must have typeset every formula (it is bundled into
`_static/mathjax` by sphinx-mathjax-offline; a CDN would not load here), no MathJax error node may appear,
no TeX delimiters or MyST markup may be left in the visible text.

Chromium is the Debian package `chromium` (`apt-get install -y chromium`; `.ci/run` installs it where it is
missing). To look at a page yourself, the same flags with `--screenshot=page.png --window-size=1280,1600`
instead of `--dump-dom` write a picture of it.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from html import unescape as html_unescape
from pathlib import Path

import pytest

from test_html import HTML, LEAKS, ROOT, visible_text

sys.path.insert(0, str(ROOT / "scripts"))
import notebooks  # noqa: E402  (the harness: which files are pages of the book)

# Without the background-networking flags Chromium tries to reach its services and its page loads fail on
# a closed network; a fresh profile directory per page keeps runs independent.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# virtual time: Chromium runs the page's timers and loads until they are idle, up to this budget (ms)
BUDGET_MS = 30000
TEX_LEFT = [r"\(", r"\[", "$$", r"\begin{"]
RAW_MARKUP = LEAKS + [":::"]
STATIC_MATH = re.compile(r'<(?:span|div) class="math notranslate nohighlight">')


def _toc_pages() -> list[str]:
    return [str(p.relative_to(ROOT).with_suffix(".html")) for p in notebooks.toc_files()]


def chromium_dom(url: str) -> str:
    """The DOM of `url` after Chromium ran its scripts (the `--dump-dom` of a headless run)."""
    browser = shutil.which("chromium")
    if browser is None:
        pytest.fail(f"{url}: chromium is not installed, and the built pages are checked in it. Install it "
                    "with `apt-get install -y chromium` (Debian package; .ci/run installs it in CI)")
    with tempfile.TemporaryDirectory(prefix="dualview-chromium-") as profile:
        run = subprocess.run([browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                              f"--virtual-time-budget={BUDGET_MS}", "--dump-dom", url],
                             capture_output=True, text=True, timeout=180)
    if run.returncode != 0 or "<body" not in run.stdout:
        pytest.fail(f"chromium could not render {url} (exit code {run.returncode}):\n" + run.stderr[-2000:])
    return run.stdout


@pytest.mark.parametrize("page", _toc_pages() if (ROOT / "_toc.yml").exists() else [])
def test_page_typesets_its_mathematics_offline(page):
    path = HTML / page
    if not path.exists():
        pytest.fail(f"{path} does not exist: build the book first (`make html` after `make notebooks`)")
    formulas = len(STATIC_MATH.findall(path.read_text(encoding="utf-8")))
    dom = chromium_dom(path.as_uri())
    typeset = dom.count("<mjx-container")
    errors = re.findall(r"<mjx-merror.*?</mjx-merror>", dom, re.S)
    assert not errors, f"{page}: MathJax could not typeset {len(errors)} formulas, e.g. " \
                       f"{visible_text(errors[0])!r}"
    assert typeset >= formulas, (
        f"{page}: {formulas} formulas in the page but only {typeset} typeset by MathJax in the browser "
        "(is _static/mathjax/tex-chtml.js in the build? does a script fail to load offline?)")
    text = visible_text(dom)
    left = [f"'{s}' in …{text[max(0, m.start() - 60):m.end() + 60]}…".replace("\n", " ")
            for s in TEX_LEFT + RAW_MARKUP for m in re.finditer(re.escape(s), text)]
    assert not left, f"{page}: source text visible in the browser after the scripts ran:\n" + "\n".join(left[:20])


# Drives a page's animations (dualview.plot.animate: matplotlib's jshtml player, frames embedded) the way a
# reader does, from a script appended to a copy of the page: it moves the first player's slider, presses
# its play button, lets the timers run, and writes what the player's <img> showed into the DOM.
ANIMATED = ["book/01_paths.html"]  # chapters that must have a figure that moves
_DRIVER = """
<script>
window.addEventListener("load", function () {
  setTimeout(function () {
    var player = document.querySelector("div.animation");
    var img = player.querySelector("img"), slider = player.querySelector("input[type=range]");
    var seen = {first: img.src, frames: Number(slider.max) + 1, alt: img.alt};
    slider.value = 2;
    slider.dispatchEvent(new Event("input"));
    seen.slid = img.src;
    seen.slider_at = Number(slider.value);
    player.querySelector('button[title="Play"]').click();
    setTimeout(function () {
      seen.played = img.src;
      seen.played_to = Number(slider.value);
      var out = document.createElement("pre");
      out.id = "dualview-animation-check";
      out.textContent = JSON.stringify({
        frames: seen.frames, alt: seen.alt, slider_at: seen.slider_at, played_to: seen.played_to,
        png: [seen.first, seen.slid, seen.played].every(function (s) {
          return s.indexOf("data:image/png;base64,") === 0; }),
        slider_changed_frame: seen.slid !== seen.first,
        play_changed_frame: seen.played !== seen.slid});
      document.body.appendChild(out);
    }, 1500);
  }, 500);
});
</script>
"""


def _animated_pages() -> list[str]:
    return sorted(set(ANIMATED) | {p for p in _toc_pages() if (HTML / p).exists()
                                   and 'class="animation"' in (HTML / p).read_text(encoding="utf-8")})


@pytest.mark.parametrize("page", _animated_pages() if (ROOT / "_toc.yml").exists() else [])
def test_animation_moves_offline(page):
    path = HTML / page
    if not path.exists():
        pytest.fail(f"{path} does not exist: build the book first (`make html` after `make notebooks`)")
    html = path.read_text(encoding="utf-8")
    assert 'class="animation"' in html, f"{page}: no animation player (dualview.plot.animate) in the page"
    external = re.findall(r'<(?:script|link|img)\b[^>]*(?:src|href)="(?:https?:)?//[^"]*"', html)
    assert not external, f"{page}: the page loads from the network: {external[:3]}"
    # the copy sits beside the page, so its relative links (_static/...) resolve as the page's own
    with tempfile.NamedTemporaryFile("w", suffix=".html", dir=path.parent, prefix=".driven-",
                                     encoding="utf-8", delete=False) as copy:
        copy.write(html.replace("</body>", _DRIVER + "</body>"))
    try:
        dom = chromium_dom(Path(copy.name).as_uri())
    finally:
        Path(copy.name).unlink()
    found = re.search(r'<pre id="dualview-animation-check">(.*?)</pre>', dom, re.S)
    assert found, f"{page}: the animation driver did not finish (a script error in the player?)"
    seen = json.loads(html_unescape(found.group(1)))
    assert seen["frames"] >= 2 and seen["png"] and seen["alt"].strip(), seen
    assert seen["slider_at"] == 2 and seen["slider_changed_frame"], \
        f"{page}: the slider did not change the frame: {seen}"
    assert seen["played_to"] > 2 and seen["play_changed_frame"], \
        f"{page}: play did not change the frame: {seen}"
