"""Figure helpers: what each cell shows (the data, the symmetric colour scale, the layout) and the
errors for inputs that do not fit the grid."""
from __future__ import annotations

import matplotlib

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
