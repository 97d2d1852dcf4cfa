"""The book's notebook harness, by concern; ``scripts/notebooks.py`` is its command line.

- ``book``: the book's sources (the table of contents, its chapters and their titles, _config.yml's repository)
  and ``Build``, the folders a build writes (passed explicitly to every command that reads or writes them);
- ``testing``: chapters prepared for nbval with their reference outputs, recording new references, the report
  of a run; ``cpu``: the CPU configurations the references are recorded and checked under;
- ``claims``: the claims report and the scoreboard page; ``instructor``: the instructor page's tables;
- ``editions``: the full book and the course build (solutions left out); ``staging``: _build/stage for
  jupyter-book;
- ``plain``: MyST rewritten as plain Markdown; ``colab``: the Colab copies, their pinned revision and sync.

Commands work on the chapters they are given (``only``; every chapter of _toc.yml when empty): there is no
global selection.
"""
