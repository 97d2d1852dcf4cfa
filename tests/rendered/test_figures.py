"""Checks of the built HTML book (run by `make test` after `make html`): every image a chapter's code draws is
a numbered figure with a caption, and its alt text describes it (not the file name myst-nb gives the PNG).

The cell metadata that produces them (``mystnb.figure`` and ``mystnb.image``) is checked on the sources by
tests/test_figure_metadata.py; this test checks what the reader gets.
"""
from __future__ import annotations

import os
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HTML = Path(os.environ.get("DUALVIEW_HTML", ROOT / "_build" / "html"))
sys.path.insert(0, str(ROOT / "scripts"))
import notebooks  # noqa: E402  (the harness: which files are chapters)

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
FILE_NAME = re.compile(r"\.(png|jpe?g|svg|gif)\b|[0-9a-f]{64}", re.I)


class _OutputImages(HTMLParser):
    """The <img> elements inside a cell's output (div.cell_output), each with its enclosing <figure>'s
    caption text and caption number."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, str]] = []       # (tag, class) of the open elements
        self.figures: list[dict] = []                # the open <figure>s, innermost last
        self.images: list[dict] = []
        self.empty_figures: list[str] = []           # captions of output figures that hold no image

    def _inside(self, tag: str, cls: str = "") -> bool:
        return any(t == tag and cls in c.split() if cls else t == tag for t, c in self.stack)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            if self._inside("div", "cell_output"):
                figure = self.figures[-1] if self.figures else None
                self.images.append({"src": attrs.get("src") or "", "alt": attrs.get("alt") or "",
                                    "figure": figure})
                if figure is not None:
                    figure["images"] += 1
            return
        if tag in VOID:
            return
        self.stack.append((tag, attrs.get("class") or ""))
        if tag == "figure":
            self.figures.append({"caption": "", "number": "", "images": 0,
                                 "in_output": self._inside("div", "cell_output"),
                                 "animation": "dualview-animation" in (attrs.get("class") or "").split()})

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in VOID:
            self.handle_endtag(tag)

    def handle_endtag(self, tag):
        if tag in VOID or not any(t == tag for t, _ in self.stack):
            return
        while self.stack:
            open_tag, _ = self.stack.pop()
            if open_tag == "figure":
                figure = self.figures.pop()
                if figure["in_output"] and not figure["images"]:
                    self.empty_figures.append(" ".join(figure["caption"].split()))
            if open_tag == tag:
                break

    def handle_data(self, data):
        if self.figures and self._inside("figcaption"):
            self.figures[-1]["caption"] += data
            if self._inside("span", "caption-number"):
                self.figures[-1]["number"] += data


def _parse(html: str) -> _OutputImages:
    parser = _OutputImages()
    parser.feed(html)
    parser.close()
    return parser


def output_images(html: str) -> list[dict]:
    return _parse(html).images


def image_problems(html: str) -> list[str]:
    parsed = _parse(html)
    # myst-nb gives the cell's figure caption to every display output of the cell: a caption on a text
    # output means the cell shows something besides its figure (e.g. a last line without a semicolon)
    problems = [f"a figure caption on an output that is not an image ({caption[:70]!r}): assign the "
                "cell's last value (`_ = ...`: under nbval IPython ignores a final ';') or move the "
                "other output to its own cell"
                for caption in parsed.empty_figures]
    for img in parsed.images:
        where = f"<img src={img['src'][:80]!r}>"
        figure = img["figure"]
        if figure is None:
            problems.append(f"{where} is not in a <figure> (give its cell mystnb.figure metadata)")
        else:
            number = " ".join(figure["number"].split())
            if not re.search(r"\d", number) and not figure["animation"]:  # plot.animate's "Animation."
                problems.append(f"{where}: its figure has no number (Sphinx's numfig off?)")
            if not figure["caption"].replace(figure["number"], "").strip():
                problems.append(f"{where}: its figure has an empty caption")
        alt = img["alt"].strip()
        if not alt:
            problems.append(f"{where} has no alt text")
        elif FILE_NAME.search(alt):
            problems.append(f"{where} has a file name as alt text ({alt[:60]!r}); set mystnb.image.alt")
    return problems


def _chapter_pages() -> dict[str, Path]:
    return {p.stem: HTML / p.relative_to(ROOT).with_suffix(".html") for p in notebooks.toc_files()
            if notebooks.is_notebook(p)}


@pytest.mark.parametrize("chapter", sorted(_chapter_pages()) if (ROOT / "_toc.yml").exists() else [])
def test_every_output_image_is_a_captioned_figure_with_alt_text(chapter):
    page = _chapter_pages()[chapter]
    if not page.exists():
        pytest.fail(f"{page} does not exist: build the book first (`make html`)")
    html = page.read_text(encoding="utf-8")
    assert output_images(html), f"{chapter}: no image in a cell output; built from executed cells?"
    problems = image_problems(html)
    assert not problems, f"{chapter}: {len(problems)} problem(s) with figures:\n  " + "\n  ".join(problems)


def test_the_check_sees_a_missing_caption_and_a_file_name_alt():
    figure = ('<div class="cell_output docutils container"><figure class="align-default" id="fig-ch01-x">'
              '<img alt="A red curve." src="../_images/a.png" /><figcaption><p><span class="caption-number">'
              'Fig. 3 </span><span class="caption-text">What it shows.</span></p></figcaption>'
              '</figure></div>')
    assert image_problems(figure) == []
    hashed = "../_images/" + "ab" * 32 + ".png"
    bare = f'<div class="cell_output docutils container"><img alt="{hashed}" src="{hashed}" /></div>'
    problems = image_problems(bare)
    assert len(problems) == 2 and "not in a <figure>" in problems[0] and "file name" in problems[1]
    unnumbered = figure.replace('<span class="caption-number">Fig. 3 </span>', "")
    assert ["no number" in p for p in image_problems(unnumbered)] == [True]
    outside = '<div class="article"><img alt="" src="logo.png"></div>'  # not a cell output: not checked
    assert output_images(outside) == []
    text = figure.replace('<img alt="A red curve." src="../_images/a.png" />', "<pre>&lt;Colorbar&gt;</pre>")
    assert ["not an image" in p for p in image_problems(text + figure)] == [True]
