"""A still picture cut into tiles for a tower of one input size: InternVL's dynamic tiling.

InternVL's image processor (transformers' GotOcr2 processor with ``crop_to_patches``) does not
squeeze a picture into one 448x448 input: it picks the grid of tiles (``columns`` x ``rows``,
between the fewest and most tiles allowed) whose shape is nearest the picture's, resizes the
picture to cover that grid exactly, cuts it into tiles row by row, and adds the whole picture
resized to one tile (a thumbnail) when there are several. Each tile is then a frame to the tower.
"""

from __future__ import annotations

import torch

from vidsight.models.base import VisionSpec
from vidsight.vision.preprocess import resize_frames


def tile_grid(height: int, width: int, tile: tuple[int, int], fewest: int, most: int) -> tuple[int, int]:
    """The ``(columns, rows)`` of tiles of ``tile`` ``(height, width)`` a ``height`` x ``width``
    picture is cut into: the arrangement of ``fewest`` to ``most`` tiles whose columns over rows is
    nearest the picture's width over height; of arrangements as near, the one with more tiles
    while the picture's area is over half of theirs (so a small picture is not blown up)."""
    # Fewest tiles first; of as many, columns ascending (the order the processor tries them in).
    arrangements = sorted(((columns, rows) for columns in range(1, most + 1) for rows in range(1, most + 1)
                           if fewest <= columns * rows <= most), key=lambda grid: grid[0] * grid[1])
    shape, area = width / height, width * height
    best, nearest = (1, 1), float("inf")
    for columns, rows in arrangements:
        off = abs(shape - columns / rows)
        if off < nearest:
            best, nearest = (columns, rows), off
        elif off == nearest and area > 0.5 * tile[0] * tile[1] * columns * rows:
            best = (columns, rows)
    return best


def tile_count(spec: VisionSpec, height: int, width: int) -> int:
    """How many frames a ``height`` x ``width`` picture becomes under ``spec``'s tiling (`VisionSpec.tiles`):
    its tiles, and a thumbnail when there are several."""
    if spec.tiles is None:
        return 1
    columns, rows = tile_grid(height, width, spec.fixed_size, *spec.tiles)
    return columns * rows + (columns * rows > 1)


def tile_picture(picture: torch.Tensor, spec: VisionSpec) -> torch.Tensor:
    """``picture`` ``(H, W, 3)`` uint8 as `tile_count` tiles ``(N, h, w, 3)`` of ``spec.fixed_size``:
    the grid's tiles row by row, then the thumbnail."""
    tile_h, tile_w = spec.fixed_size
    columns, rows = tile_grid(picture.shape[0], picture.shape[1], spec.fixed_size, *spec.tiles)
    canvas = resize_frames(picture[None], (tile_h * rows, tile_w * columns))[0]   # (3, rows * h, columns * w)
    tiles = canvas.view(3, rows, tile_h, columns, tile_w).permute(1, 3, 2, 4, 0).reshape(-1, tile_h, tile_w, 3)
    if len(tiles) == 1:
        return tiles
    thumbnail = resize_frames(picture[None], spec.fixed_size).permute(0, 2, 3, 1)
    return torch.cat([tiles, thumbnail])
