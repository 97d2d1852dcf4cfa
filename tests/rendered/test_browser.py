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

import re
import shutil
import subprocess
import sys
import tempfile
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
