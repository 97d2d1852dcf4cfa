"""Figure helpers: what each cell shows (the data, the symmetric colour scale, the layout) and the
errors for inputs that do not fit the grid."""
from __future__ import annotations

import io

import matplotlib
import matplotlib.image

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from dualview import plot  # noqa: E402


def test_heatmap_is_centred_on_zero_and_sums_channels():
    fig, ax = plt.subplots()
    values = torch.tensor([[[1.0, -3.0], [0.5, 0.0]], [[1.0, 0.0], [0.0, 0.0]]])  # (C, H, W)
    im = plot.heatmap(ax, values, title="t")
    np.testing.assert_array_equal(im.get_array(), [[2.0, -3.0], [0.5, 0.0]])
    assert im.get_clim() == (-3.0, 3.0) and ax.get_title() == "t"
    assert plot.heatmap(ax, values, limit=10.0).get_clim() == (-10.0, 10.0)  # one scale for several maps
    plt.close(fig)


def test_show_image_grey_and_rgb():
    fig, (a, b) = plt.subplots(1, 2)
    grey = plot.show_image(a, torch.arange(6.0).view(1, 2, 3))
    assert grey.get_array().shape == (2, 3) and grey.get_cmap().name == "gray"
    rgb = plot.show_image(b, torch.full((3, 2, 2), 2.0))  # RGB, clipped to [0, 1]
    assert rgb.get_array().shape == (2, 2, 3) and float(rgb.get_array().max()) == 1.0
    with pytest.raises(ValueError, match="1 or 3 channels"):
        plot.show_image(a, torch.zeros(2, 2, 2, 2))
    plt.close(fig)


def test_heatmap_grid_layout_and_cells():
    images = torch.rand(3, 1, 4, 4)
    maps = {"gradient": torch.randn(3, 1, 4, 4), "Insens": torch.randn(3, 4, 4)}
    fig = plot.heatmap_grid(images, maps, row_names=["a", "b", "c"], title="grid")
    axes = np.array(fig.axes).reshape(3, 3)
    assert [ax.get_title() for ax in axes[0]] == ["input", "gradient", "Insens"]
    assert [ax.get_ylabel() for ax in axes[:, 0]] == ["a", "b", "c"]
    cell = axes[2, 2].images[0]  # row 2, column "Insens": that input's map, on its own symmetric scale
    np.testing.assert_allclose(cell.get_array(), maps["Insens"][2].numpy())
    lim = maps["Insens"][2].abs().max().item()
    np.testing.assert_allclose(cell.get_clim(), (-lim, lim))
    np.testing.assert_allclose(axes[1, 0].images[0].get_array(), images[1, 0].numpy())
    plt.close(fig)
    fig = plot.heatmap_grid(images, {"scaled": torch.rand(3, 1, 4, 4)}, as_images=True)
    assert fig.axes[1].images[0].get_cmap().name == "gray"
    plt.close(fig)
    rgb = torch.randn(3, 3, 4, 4) * 5 + 2                      # RGB maps far outside [0, 1]
    fig = plot.heatmap_grid(images, {"rescaled": rgb}, rescale=True)
    shown = fig.axes[3].images[0].get_array()                  # row 1's map, (H, W, C) in [0, 1]
    want = (rgb[1] - rgb[1].min()) / (rgb[1].max() - rgb[1].min())   # min-max over all its channels
    np.testing.assert_allclose(shown, want.permute(1, 2, 0).numpy(), rtol=1e-5, atol=1e-6)
    plt.close(fig)


def test_heatmap_grid_refuses_columns_of_the_wrong_length():
    with pytest.raises(ValueError, match="one map per input"):
        plot.heatmap_grid(torch.rand(3, 1, 4, 4), {"m": torch.rand(2, 4, 4)})
    with pytest.raises(ValueError, match="row name"):
        plot.heatmap_grid(torch.rand(3, 1, 4, 4), {"m": torch.rand(3, 4, 4)}, row_names=["a"])


def test_image_grid_titles_and_empty_cells():
    fig = plot.image_grid(torch.rand(5, 1, 4, 4), titles=list("abcde"), ncols=3)
    assert len(fig.axes) == 6 and [ax.get_title() for ax in fig.axes] == ["a", "b", "c", "d", "e", ""]
    assert not fig.axes[5].images  # the sixth cell is empty
    plt.close(fig)


def _grey_frames(n):
    """draw(fig, i) for animate: frame i is one flat grey of level i / (n - 1), the whole figure."""
    def draw(fig, i):
        ax = fig.add_axes([0, 0, 1, 1])
        ax.imshow([[i / (n - 1)]], cmap="gray", vmin=0, vmax=1, aspect="auto")
        ax.axis("off")
    return draw


def _grey_level(png: bytes) -> float:
    pixels = matplotlib.image.imread(io.BytesIO(png))
    return float(pixels[pixels.shape[0] // 2, pixels.shape[1] // 2, 0])


def test_animate_embeds_every_frame_and_needs_no_network():
    n = 5
    with matplotlib.rc_context({"savefig.dpi": 300}):  # a user's setting does not change the frames' size
        anim = plot.animate(_grey_frames(n), n, alt="a grey square", figsize=(2, 1), dpi=40)
    frames = anim.frames
    assert len(frames) == n == anim.n_frames
    levels = [_grey_level(f) for f in frames]
    np.testing.assert_allclose(levels, np.linspace(0, 1, n), atol=2 / 255)  # frame i shows draw(fig, i)
    assert matplotlib.image.imread(io.BytesIO(frames[0])).shape[:2] == (40, 80)  # figsize x dpi
    np.testing.assert_allclose(_grey_level(anim.frame_png(3)), levels[3], atol=1e-6)  # drawn live: same
    html = anim.html
    assert html.count('alt="a grey square"') == 1 and 'type="range"' in html and "play_animation" in html
    for external in ("http://", "https://", "<link", "fa fa-"):  # no CDN, no icon font
        assert external not in html, external
    bundle = anim._repr_mimebundle_()  # no kernel here: the player alone
    assert bundle["text/html"] == html and "application/vnd.jupyter.widget-view+json" not in bundle


def test_animate_refuses_what_would_not_show():
    with pytest.raises(ValueError, match="at least 2 frames"):
        plot.animate(_grey_frames(2), 1, alt="x")
    with pytest.raises(ValueError, match="alt text"):
        plot.animate(_grey_frames(2), 2, alt=" ")
    with pytest.raises(ValueError, match="palette, 2 to 256"):
        plot.animate(_grey_frames(2), 2, alt="x", colors=1)
    with pytest.raises(ValueError, match="fewer frames"):
        plot.animate(_grey_frames(3), 3, alt="x", figsize=(4, 4), dpi=50, max_mb=0.001)
    anim = plot.animate(_grey_frames(2), 2, alt="x", figsize=(1, 1), dpi=20)
    with pytest.raises(IndexError, match="frames 0 to 1"):
        anim.frame_png(2)


def test_animate_palette_keeps_the_picture_with_few_colours():
    def ramp(fig, i):  # a smooth grey ramp: 64 levels
        ax = fig.add_axes([0, 0, 1, 1])
        ax.imshow(np.linspace(0, 1, 64)[None, :] * (i + 1) / 2, cmap="gray", vmin=0, vmax=1, aspect="auto")
        ax.axis("off")

    full = plot.animate(ramp, 2, alt="ramp", figsize=(2, 1), dpi=32, colors=None)
    few = plot.animate(ramp, 2, alt="ramp", figsize=(2, 1), dpi=32, colors=8)
    for a, b in zip(full.frames, few.frames):
        exact = matplotlib.image.imread(io.BytesIO(a))[..., :3]
        reduced = matplotlib.image.imread(io.BytesIO(b))[..., :3]
        colours = [len(np.unique(im.reshape(-1, 3), axis=0)) for im in (reduced, exact)]
        assert colours[0] <= 8 < colours[1]
        assert np.abs(reduced - exact).max() < 0.1  # each pixel near its true colour


def test_animation_live_widget_draws_the_frame_the_slider_selects(monkeypatch):
    pytest.importorskip("ipywidgets")
    n = 4
    anim = plot.animate(_grey_frames(n), n, alt="grey", figsize=(1, 1), dpi=20)
    box = anim.widget()
    (play, slider), image = box.children[0].children, box.children[1]
    assert (slider.min, slider.max, play.max) == (0, n - 1, n - 1)
    np.testing.assert_allclose(_grey_level(image.value), 0.0, atol=2 / 255)
    slider.value = 2
    np.testing.assert_allclose(_grey_level(image.value), 2 / 3, atol=2 / 255)
    # in a kernel the output offers the live widget beside the player (a front end picks one)
    import IPython

    monkeypatch.setattr(IPython, "get_ipython", lambda: type("Shell", (), {"kernel": object()})())
    bundle = anim._repr_mimebundle_()
    view = bundle["application/vnd.jupyter.widget-view+json"]
    assert view["version_major"] == 2 and isinstance(view["model_id"], str) and view["model_id"]
    assert bundle["text/html"] == anim.html
