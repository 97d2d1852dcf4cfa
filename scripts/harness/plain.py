"""Plain notebooks: the Colab copies and the student notebooks are read by plain Jupyter/Colab renderers, which
know no MyST. Every role and directive the chapters use is rewritten as Markdown (a test forbids what is left):
glued values, citations, cross-references, API roles, theorem-like boxes, exercises and solutions."""
from __future__ import annotations

import re
import sys

from .book import ROOT, repository, toc_files

BOOK_RUN_MARK = "†"  # follows a value taken from the book's own run
NOT_RUN_TEXT = "*(computed when the notebook runs)*"  # a glued value the book's run does not provide


def pages_url() -> str:
    """The address of the online book: GitHub Pages of the repository of _config.yml (the one setting)."""
    match = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)(?:\.git)?", repository())
    if match is None:
        sys.exit(f"_config.yml: repository.url is {repository()!r}; set it to https://github.com/<owner>/<name>")
    return f"https://{match[1]}.github.io/{match[2]}"


def page(doc: str, anchor: str = "") -> str:
    return f"{pages_url()}/{doc}.html" + (f"#{anchor}" if anchor else "")


def bibliography() -> dict[str, str]:
    """'Author (year)' by BibTeX key, from references.bib; same authors and year get letters (2022a, 2022b)
    in the order of their titles."""
    text = (ROOT / "references.bib").read_text(encoding="utf-8")
    entries = {}
    for entry in re.split(r"\n(?=@)", text):
        key = re.match(r"@\w+\{([^,\s]+),", entry.strip())
        if not key:
            continue
        field = {name: m[1] if (m := re.search(rf"\b{name}\s*=\s*\{{(.*?)\}},?\s*\n", entry + "\n", re.S))
                 else "" for name in ("author", "year", "title")}
        names = [" ".join(a.split()) for a in re.split(r"\s+and\s+", field["author"])] or ["Anonymous"]
        last = [latex_text(n.split(",")[0] if "," in n else n.split()[-1]) for n in names]
        who = last[0] if len(last) == 1 else " and ".join(last) if len(last) == 2 else f"{last[0]} et al."
        entries[key[1]] = (who, field["year"].strip("{} ") or "n.d.", field["title"])
    out = {}
    for key, (who, year, title) in entries.items():
        same = sorted((t, k) for k, (w, y, t) in entries.items() if (w, y) == (who, year))
        letter = "abcdefghij"[[k for _, k in same].index(key)] if len(same) > 1 else ""
        out[key] = f"{who} ({year}{letter})"
    return out


_ACCENTS = {"'": "\u0301", '"': "\u0308", "`": "\u0300", "^": "\u0302", "~": "\u0303", "c": "\u0327"}


def latex_text(name: str) -> str:
    """A BibTeX name as text: accents (``{\\'u}``, ``\\"o``) as Unicode, braces dropped."""
    import unicodedata

    name = re.sub(r"\\(['\"`^~c])\s*\{?(\w)\}?", lambda m: m[2] + _ACCENTS[m[1]], name)
    return unicodedata.normalize("NFC", name.replace("{", "").replace("}", "").strip())


_TARGET = re.compile(r"^\(([\w-]+)\)=[ \t]*\n+(?:#+[ \t]*(.*))?", re.M)
_DIRECTIVE_LABEL = re.compile(r"^(?:`{3,}|:{3,})\{([\w:-]+)\}[ \t]*([^\n]*)\n(?::[\w-]+:[^\n]*\n)*?:label:[ \t]*(\S+)", re.M)


def labels() -> dict[str, tuple[str, str]]:
    """(page, title) of every cross-reference target of the book: ``(label)=`` and directives' ``:label:``."""
    out = {}
    for path in toc_files():
        doc = path.relative_to(ROOT).with_suffix("").as_posix()
        text = path.read_text(encoding="utf-8")
        for match in _TARGET.finditer(text):
            out[match[1]] = (doc, (match[2] or match[1]).strip())
        for match in _DIRECTIVE_LABEL.finditer(text):
            kind = match[1].split(":")[-1].capitalize()
            out[match[3]] = (doc, f"{kind}: {match[2].strip()}" if match[2].strip() else kind)
    return out


def format_glued(text: str, spec: str) -> str:
    """A glued value's plain-text display formatted as myst-nb's ``{glue:text}`name:spec``` does."""
    import ast

    try:
        value = ast.literal_eval(text)
    except (SyntaxError, ValueError):
        value = text
    if not spec:
        return str(value)
    kind = spec[-1]
    value = str(value) if kind == "s" else int(value) if kind in "bcdoxX" else \
        float(value) if kind in "eEfFgGn%" else value
    return format(value, spec)


class Plain:
    """Rewrites a chapter's Markdown cells without MyST: glued values, citations, cross-references, API roles,
    theorem-like boxes, exercises and solutions, targets and equation labels."""

    def __init__(self, values: dict[str, str], first_exercise: int):
        self.values, self.used, self.missing = values, set(), set()
        self.bib, self.labels = bibliography(), labels()
        self.next_exercise, self.numbers = first_exercise, {}

    # roles ------------------------------------------------------------------------------------------------
    def _glue(self, content: str) -> str:
        name, _, spec = content.partition(":")
        if name not in self.values:
            self.missing.add(name)
            return NOT_RUN_TEXT
        self.used.add(name)
        return format_glued(self.values[name], spec) + BOOK_RUN_MARK

    def _cite(self, role: str, content: str) -> str:
        keys = [k.strip() for k in content.split(",")]
        unknown = [k for k in keys if k not in self.bib]
        if unknown:
            raise ValueError(f"cited keys {unknown} are not in references.bib")
        link = page("book/bibliography")
        if role == "cite:p":
            return "(" + "; ".join(f"[{self.bib[k].replace(' (', ', ').rstrip(')')}]({link})" for k in keys) + ")"
        return ", ".join(f"[{self.bib[k]}]({link})" for k in keys)

    def _ref(self, role: str, content: str) -> str:
        text, label = (m[1].strip(), m[2]) if (m := re.fullmatch(r"(.*?)\s*<([^>]+)>", content, re.S)) else \
            (None, content.strip())
        if role == "eq":
            return f"({label})"
        if label not in self.labels:
            raise ValueError(f"{{{role}}}`{content}`: no target {label!r} in the book")
        doc, title = self.labels[label]
        if not text:  # a title may hold roles itself: as plain text inside the link
            title = _ROLE.sub(lambda m: "; ".join(self.bib.get(k.strip(), k) for k in m[2].split(","))
                              if m[1].startswith("cite") else m[2].rsplit("<", 1)[0].strip(), title)
        return f"[{text or title}]({page(doc, label)})"

    def _api(self, role: str, content: str) -> str:
        text, target = (m[1].strip(), m[2]) if (m := re.fullmatch(r"(.*?)\s*<([^>]+)>", content, re.S)) else \
            (None, content.strip())
        short = target.lstrip("~")
        shown = text or (short.rsplit(".", 1)[-1] if target.startswith("~") else short)
        if role.endswith("func") and not text:
            shown += "()"
        return f"[`{shown}`]({page('book/api', short)})"

    def role(self, match: re.Match) -> str:
        role, content = match[1], match[2]
        if role in ("glue", "glue:text"):
            return self._glue(content)
        if role.startswith("cite"):
            return self._cite(role, content)
        if role in ("ref", "numref", "prf:ref", "eq", "doc"):
            return self._ref(role, content)
        if role in ("func", "class", "mod", "meth", "attr") or role.startswith("py:"):
            return self._api(role, content)
        if role == "math":
            return f"${content}$"
        raise ValueError(f"the MyST role {{{role}}} has no plain-Markdown rewrite (scripts/harness/plain.py, Plain)")

    # directives -------------------------------------------------------------------------------------------
    def directive(self, match: re.Match) -> str:
        name, argument, options, body = match[2], match[3].strip(), match[4], match[5].strip("\n")
        label = m[1] if (m := re.search(r"^:label:[ \t]*(\S+)", options, re.M)) else None
        if name == "exercise":  # numbered through the book, as the HTML numbers them
            number, self.next_exercise = self.next_exercise, self.next_exercise + 1
            if label:
                self.numbers[label] = number
            return f"#### Exercise {number}\n\n{body}"
        if name == "solution-start":
            number = self.numbers.get(argument)
            return f"#### Solution to Exercise {number}" if number else "#### Solution"
        if name == "solution-end":
            return ""
        if name.startswith("prf:"):
            kind = name[4:].capitalize()
            if kind == "Proof":
                return "\n".join(f"> {line}".rstrip() for line in f"*Proof.* {body} ∎".splitlines())
            head = f"**{kind}: {argument}**" if argument else f"**{kind}.**"
            return "\n".join(f"> {line}".rstrip() for line in f"{head}\n\n{body}".splitlines())
        if name == "admonition":  # the reproducibility notes: collapsed in Jupyter and Colab too
            collapsed = "dropdown" in options
            if collapsed:
                return f"<details><summary><b>{argument}</b></summary>\n\n{body}\n\n</details>"
            return "\n".join(f"> {line}".rstrip() for line in f"**{argument}**\n\n{body}".splitlines())
        raise ValueError(f"the MyST directive {{{name}}} has no plain-Markdown rewrite "
                         "(scripts/harness/plain.py, Plain)")

    def markdown(self, source: str) -> str:
        for _ in range(3):  # directives nest (a proof in a theorem): rewrite the innermost first
            source = _DIRECTIVE.sub(self.directive, source)
        source = _ROLE.sub(self.role, source)
        source = _TARGET_LINE.sub("", source)
        source = _MATH_LABEL.sub("$$", source)
        return re.sub(r"\n{3,}", "\n\n", source).strip("\n")


_DIRECTIVE = re.compile(r"^(`{3,}|:{3,})\{([\w:-]+)\}([^\n]*)\n((?::[\w-]+:[^\n]*\n)*)"
                        r"((?:(?!^\1\{)(?!^(?:`{3,}|:{3,})\{).)*?)^\1[ \t]*$", re.S | re.M)
_ROLE = re.compile(r"\{([\w:-]+)\}`([^`]*)`")
_TARGET_LINE = re.compile(r"^\([\w-]+\)=[ \t]*\n", re.M)
_MATH_LABEL = re.compile(r"\$\$[ \t]*\([\w-]+\)[ \t]*$", re.M)
# what a plain renderer would show raw: a role, a directive fence, a target, a labelled equation
MYST_SYNTAX = re.compile(r"\{[\w:-]+\}`|^(?:`{3,}|:{3,})\{|:::\{|^\([\w-]+\)=|\$\$[ \t]*\([\w-]+\)", re.M)
