"""Shared figure helpers: red/blue heatmaps, images, grids of both, and drawings of (active) sub-networks."""
from __future__ import annotations

import base64
import io
import re
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.animation import FuncAnimation
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from torch import Tensor, nn

from dualview.gates import record_gates
from dualview.paths import fc_layers

__all__ = ["heatmap", "show_image", "image_grid", "heatmap_grid", "draw_network", "animate", "Animation"]


def _np(a) -> np.ndarray:
    return a.detach().cpu().numpy() if isinstance(a, Tensor) else np.asarray(a)


def _bare(ax, title: str | None) -> None:
    ax.set_xticks([])
    ax.set_yticks([])
    if title:
        ax.set_title(title, fontsize=9)


def heatmap(ax, values, title: str | None = None, symmetric: bool = True, cmap: str = "bwr",
            limit: float | None = None):
    """Show a 2-D map; with ``symmetric`` the colour scale is centred on 0 (red > 0, blue < 0).

    A ``(C, H, W)`` map is summed over its channels. The scale runs to ``±limit`` (default: the map's
    largest magnitude); give one ``limit`` to several maps to compare them on one scale.
    """
    v = _np(values).squeeze()
    if v.ndim == 3:  # (C, H, W): sum over channels
        v = v.sum(0)
    lim = (np.abs(v).max() or 1.0) if limit is None else limit
    im = ax.imshow(v, cmap=cmap, vmin=-lim if symmetric else None, vmax=lim if symmetric else None)
    _bare(ax, title)
    return im


def show_image(ax, image, title: str | None = None, cmap: str = "gray"):
    """Show one image: ``(C, H, W)`` with 1 channel (grey, ``cmap``) or 3 (RGB in [0, 1]), or ``(H, W)``.

    No ticks and no frame, but a ``ylabel`` set afterwards stays visible (a row name of a grid).
    """
    im = _np(image)
    if im.ndim == 3 and im.shape[0] in (1, 3):
        im = im[0] if im.shape[0] == 1 else np.clip(np.transpose(im, (1, 2, 0)), 0, 1)
    if im.ndim not in (2, 3):
        raise ValueError(f"show_image shows a (C, H, W) image with 1 or 3 channels or an (H, W) one, "
                         f"got shape {_np(image).shape}")
    out = ax.imshow(im, cmap=cmap if im.ndim == 2 else None)
    _bare(ax, title)
    for spine in ax.spines.values():
        spine.set_visible(False)
    return out


def image_grid(images, titles=None, ncols: int = 8, cmap: str = "gray", size: float = 1.4, symmetric=False):
    """Plot a batch ``(N, C, H, W)`` (or ``(N, H, W)``) of images on a grid; returns the figure.

    With ``symmetric`` each image is a red/blue :func:`heatmap` instead.
    """
    imgs = _np(images)
    n = len(imgs)
    nrows = int(np.ceil(n / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols, size * nrows + 0.3 * (titles is not None)),
                             squeeze=False)
    for k, ax in enumerate(axes.flat):
        ax.axis("off")
        if k >= n:
            continue
        title = None if titles is None else str(titles[k])
        if symmetric:
            heatmap(ax, imgs[k], title=title)
        else:
            show_image(ax, imgs[k], title=title, cmap=cmap)
        ax.title.set_fontsize(8)
    fig.tight_layout()
    return fig


def heatmap_grid(images, maps: Mapping[str, object], row_names: Sequence[str] | None = None,
                 title: str | None = None, image_title: str = "input", size: float = 1.9,
                 as_images: bool = False, rescale: bool = False):
    """One row per input: the input image, then one cell per entry of ``maps``; returns the figure.

    ``images``: ``(N, C, H, W)`` (or ``(N, H, W)``); ``maps``: ``{column title: (N, ...) maps}``, one map
    per input, each shown as a red/blue :func:`heatmap` on its own scale (``as_images``: as images, for
    maps already scaled to ``[0, 1]``; ``rescale``: as images after a min-max rescaling of each map to
    ``[0, 1]``, all channels together, like torchvision's ``make_grid(scale_each=True)``). ``row_names``
    label the rows. The layout of an attribution figure: inputs down the side, one method (or target,
    or network) per column.
    """
    imgs = _np(images)
    cols = {name: _np(v) for name, v in maps.items()}
    if rescale:
        as_images = True
        for name, v in cols.items():
            flat = v.reshape(len(v), -1)
            low, high = flat.min(1, keepdims=True), flat.max(1, keepdims=True)
            cols[name] = ((flat - low) / np.maximum(high - low, 1e-12)).reshape(v.shape)
    wrong = {name: len(v) for name, v in cols.items() if len(v) != len(imgs)}
    if wrong or (row_names is not None and len(row_names) != len(imgs)):
        raise ValueError(f"heatmap_grid needs one map per input ({len(imgs)} inputs) in every column and "
                         f"one row name per input; got columns of {wrong} and "
                         f"{None if row_names is None else len(row_names)} row names")
    n, ncols = len(imgs), 1 + len(cols)
    fig, axes = plt.subplots(n, ncols, figsize=(size * ncols, size * n + 0.4 * (title is not None)), squeeze=False)
    for r in range(n):
        show_image(axes[r, 0], imgs[r], title=image_title if r == 0 else None)
        if row_names is not None:
            axes[r, 0].set_ylabel(str(row_names[r]), fontsize=9)
        for c, (name, v) in enumerate(cols.items(), start=1):
            show = show_image if as_images else heatmap
            show(axes[r, c], v[r], title=name if r == 0 else None)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def draw_network(model: nn.Module, x: Tensor | None = None, ax=None, title: str | None = None,
                 input_size: float = 12.0):
    """Draw a small fully connected ReLU network; with an input ``x``, highlight its active sub-network.

    Units are drawn in columns, one per layer. With ``x`` (one input), units whose gate is off are
    hollow and every edge that touches them is faded: what remains in colour is the active
    sub-network, an affine network, linear in the augmented input (red: positive weight, blue: negative;
    line width grows with the weight's magnitude).
    Input units are sized by the magnitude of the input coordinate.
    """
    layers = fc_layers(model)
    sizes = [layers[0].in_features] + [lin.out_features for lin in layers]
    if max(sizes) > 200:
        raise ValueError(f"draw_network is meant for small networks (at most 200 units a layer), got {sizes}")
    if ax is None:
        _, ax = plt.subplots(figsize=(2.2 * len(sizes), 5))
    on = [np.ones(s, dtype=bool) for s in sizes]
    xin = np.ones(sizes[0])
    if x is not None:
        if x.shape[0] != 1:
            raise ValueError(f"draw_network shows one input at a time, got a batch of {x.shape[0]}")
        with torch.no_grad():
            rec = record_gates(model, x.flatten(1).to(layers[0].weight.dtype))
        gates = [_np(g[0]).astype(bool) for g in rec.gates.values()]
        xin = _np(x.flatten())
        on = [xin != 0] + gates + [np.ones(sizes[-1], dtype=bool)]
    ys = [np.linspace(1, 0, s) if s > 1 else np.array([0.5]) for s in sizes]
    for l, lin in enumerate(layers):
        W = _np(lin.weight)
        i, j = np.meshgrid(np.arange(sizes[l]), np.arange(sizes[l + 1]))
        i, j, w = i.ravel(), j.ravel(), W.ravel()
        segs = np.stack([np.stack([np.full_like(w, l), ys[l][i]], 1),
                         np.stack([np.full_like(w, l + 1), ys[l + 1][j]], 1)], 1)
        live = on[l][i] & on[l + 1][j]
        scale = np.abs(w).max() or 1.0
        faded = LineCollection(segs[~live], colors="0.85", linewidths=0.3, zorder=1)
        colors = np.where(w[live, None] > 0, [[0.84, 0.15, 0.16, 1.0]], [[0.12, 0.47, 0.71, 1.0]])
        colors[:, 3] = 0.25 + 0.75 * np.abs(w[live]) / scale
        lit = LineCollection(segs[live], colors=colors, linewidths=0.3 + 1.7 * np.abs(w[live]) / scale, zorder=2)
        ax.add_collection(faded)
        ax.add_collection(lit)
    for l, s in enumerate(sizes):
        size = input_size * (0.2 + np.abs(xin) / (np.abs(xin).max() or 1)) if l == 0 else 40
        face = np.where(on[l], "k", "white")
        ax.scatter(np.full(s, l), ys[l], s=size, c=face, edgecolors="k", linewidths=0.6, zorder=3)
    ax.set_xlim(-0.3, len(sizes) - 0.7)
    ax.set_ylim(-0.05, 1.05)
    ax.set_xticks(range(len(sizes)))
    ax.set_xticklabels(["input"] + [f"hidden {l}" for l in range(1, len(sizes) - 1)] + ["output"])
    ax.set_yticks([])
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    if title:
        ax.set_title(title)
    return ax


# matplotlib's jshtml player draws its buttons with Font Awesome icons loaded from a CDN; offline they would
# be blank, so :func:`animate` replaces each icon by a character every font has and drops the stylesheet link
_OFFLINE_ICONS = {"fa fa-minus": "&minus;", "fa fa-fast-backward": "|&#9664;&#9664;",
                  "fa fa-step-backward": "|&#9664;", "fa fa-play fa-flip-horizontal": "&#9664;",
                  "fa fa-pause": "&#10074;&#10074;", "fa fa-play": "&#9654;",
                  "fa fa-step-forward": "&#9654;|", "fa fa-fast-forward": "&#9654;&#9654;|",
                  "fa fa-plus": "+"}
_FRAME = re.compile(r'"data:image/png;base64,([^"]+)"')
_EXTERNAL = re.compile(r"""(?:href|src)\s*=\s*["']?(?:https?:)?//""", re.I)


def _palette_png(png: bytes, colors: int | None) -> bytes:
    """``png`` with its colours reduced to a palette of ``colors`` (a figure of lines and text needs few;
    the file shrinks about fourfold); ``None`` keeps it as it is."""
    if colors is None:
        return png
    from PIL import Image

    out = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=colors).save(out, format="png", optimize=True)
    return out.getvalue()


def _offline_player(html: str, alt: str) -> str:
    """The jshtml player with its icons as characters, no external stylesheet, and ``alt`` on its image."""
    html = re.sub(r"<link[^>]*font-awesome[^>]*>", "", html)

    def icon(m: re.Match) -> str:
        if m.group(1) not in _OFFLINE_ICONS:
            raise RuntimeError(f"matplotlib's jshtml player uses an icon plot.animate does not know "
                               f"({m.group(1)!r}); add it to plot._OFFLINE_ICONS")
        return f'<span aria-hidden="true">{_OFFLINE_ICONS[m.group(1)]}</span>'

    html = re.sub(r'<i class="([^"]*)"></i>', icon, html)
    escaped = alt.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
    html, n = re.subn(r"<img id=", f'<img alt="{escaped}" id=', html)
    if n != 1 or _EXTERNAL.search(html):
        raise RuntimeError("matplotlib's jshtml player changed: plot.animate expects one <img> and no "
                           "external link after its replacements; update plot._offline_player")
    return html


@dataclass(eq=False)
class Animation:
    """Precomputed frames of a figure, shown with a slider and play buttons (see :func:`animate`).

    ``html`` is the player: every frame embedded as a base64 PNG, with its own JavaScript and no link to
    the network, so it works in a static page. Displayed in a running Jupyter kernel with ``ipywidgets``
    installed, the output also offers :meth:`widget` (the same frames drawn live on request), which a
    notebook front end shows instead; the book's HTML build renders the player (``_config.yml`` ranks
    ``text/html`` above widget views).
    """

    html: str = field(repr=False)
    n_frames: int
    alt: str
    draw: Callable[[Figure, int], object] = field(repr=False)
    figsize: tuple[float, float] = (6.0, 3.0)
    dpi: float = 72.0
    interval: int = 200
    colors: int | None = 64

    @property
    def frames(self) -> list[bytes]:
        """The embedded frames, decoded (PNG bytes, in order)."""
        # b64decode skips the line breaks (a backslash and a newline) in matplotlib's frames
        return [base64.b64decode(f) for f in _FRAME.findall(self.html)]

    def frame_png(self, index: int) -> bytes:
        """Draw frame ``index`` afresh and return it as PNG bytes (what the live widget shows)."""
        if not 0 <= index < self.n_frames:
            raise IndexError(f"frame {index} does not exist: the animation has frames 0 to "
                             f"{self.n_frames - 1}")
        fig = Figure(figsize=self.figsize, dpi=self.dpi)
        self.draw(fig, index)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=self.dpi)
        return _palette_png(buf.getvalue(), self.colors)

    def widget(self):
        """The same exploration as a live ipywidgets control (ipywidgets 7 or 8): a play button and a
        slider; each frame is drawn by the kernel when the slider reaches it."""
        import ipywidgets as widgets

        image = widgets.Image(value=self.frame_png(0), format="png")
        slider = widgets.IntSlider(value=0, min=0, max=self.n_frames - 1, description="frame")
        play = widgets.Play(value=0, min=0, max=self.n_frames - 1, interval=self.interval)
        widgets.jslink((play, "value"), (slider, "value"))
        slider.observe(lambda change: setattr(image, "value", self.frame_png(change["new"])), names="value")
        return widgets.VBox([widgets.HBox([play, slider]), image])

    def _repr_mimebundle_(self, include=None, exclude=None):
        data = {"text/plain": f"<Animation: {self.n_frames} frames; {self.alt}>", "text/html": self.html}
        try:
            from IPython import get_ipython
            import ipywidgets  # noqa: F401
        except ImportError:  # no kernel or no ipywidgets: the player alone
            return data
        if getattr(get_ipython(), "kernel", None) is None:
            return data
        live = self.widget()
        data["application/vnd.jupyter.widget-view+json"] = {"version_major": 2, "version_minor": 0,
                                                            "model_id": live.model_id}
        return data


def animate(draw: Callable[[Figure, int], object], n_frames: int, *, alt: str, caption: str = "",
            figsize: tuple[float, float] = (6.0, 3.0), dpi: float = 72.0, interval: int = 200,
            colors: int | None = 64, max_mb: float = 2.0) -> Animation:
    """A figure that moves in a static page: ``draw(fig, i)`` draws frame ``i`` on an empty figure.

    Renders the ``n_frames`` frames once with matplotlib's ``FuncAnimation.to_jshtml`` (a slider, play
    buttons, the frames embedded as PNGs; its CDN icons replaced by characters so nothing is fetched)
    and returns an :class:`Animation` that a notebook displays. ``alt`` says what the frames show (the
    image's alt text); ``caption``, if given, is shown under the player as the caption of an HTML
    ``<figure>`` (the book's numbered figure captions apply only to image outputs, so an animation's caption
    reads "Animation." and its text); ``interval`` is the time between frames in milliseconds. The page carries every
    frame, so keep ``n_frames``, ``figsize`` and ``dpi`` small: each frame is stored with a palette of
    ``colors`` colours (``None``: full colour), and a player larger than ``max_mb`` megabytes is refused.
    """
    if not isinstance(n_frames, int) or n_frames < 2:
        raise ValueError(f"animate needs at least 2 frames (an int), got {n_frames!r}")
    if colors is not None and not 2 <= colors <= 256:
        raise ValueError(f"colors is the size of each frame's palette, 2 to 256 (or None), got {colors}")
    if not alt or not alt.strip():
        raise ValueError("animate needs an alt text that says what the frames show (alt='...')")
    fig = Figure(figsize=figsize, dpi=dpi)  # not a pyplot figure: the notebook does not show it as a PNG

    def update(i):
        fig.clear()
        draw(fig, i)
        return []

    anim = FuncAnimation(fig, update, frames=n_frames, init_func=lambda: [], interval=interval,
                         repeat=False)
    with matplotlib.rc_context({"savefig.dpi": dpi, "animation.embed_limit": 4 * max_mb + 1,
                                "animation.frame_format": "png"}):
        html = anim.to_jshtml()
    html = _FRAME.sub(lambda m: '"data:image/png;base64,' + base64.b64encode(
        _palette_png(base64.b64decode(m.group(1)), colors)).decode("ascii") + '"', html)
    html = _offline_player(html, alt)
    if caption.strip():
        text = caption.strip().replace("&", "&amp;").replace("<", "&lt;")
        html = (f'<figure class="dualview-animation">{html}<figcaption><p><span class="caption-number">'
                f"Animation. </span>{text}</p></figcaption></figure>")
    result = Animation(html, n_frames, alt, draw, tuple(figsize), dpi, interval, colors)
    size_mb = len(result.html) / 2**20
    if size_mb > max_mb or len(result.frames) != n_frames:
        raise ValueError(f"the animation's player is {size_mb:.1f} MB for {n_frames} frames (limit "
                         f"max_mb={max_mb}): use fewer frames, a smaller figsize or a lower dpi")
    return result
