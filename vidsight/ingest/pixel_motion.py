"""Motion estimated from decoded pixels, for codecs whose FFmpeg decoder exports no vectors.

HEVC, AV1 and VP9 decoders export no ``MOTION_VECTORS`` side data, so the motion rule has
nothing to judge there. This estimates what an encoder's motion search would have found, cheaply
enough to run on every decoded frame: the luma reduced to about `REDUCED_WIDTH` pixels across
(4x per side at 640x360, 8x at 1280x720), then per 4x4 block of the reduced picture (a 16x16
block of a 640x360 frame, 32x32 of a 1280x720 one) the change against the previous frame. A
block whose change stands out from the frame's own (the median block's, which on a static camera
is sensor noise and coding noise), or any changed block where the whole picture changed (a pan),
gets a vector from Lucas-Kanade's least-squares flow over the block (or, where that flow fails,
as for an object moving farther than a reduced pixel, from matching the block against the previous
picture: `block_search`); every other block is still, as a codec's skipped block is. Motion is
estimated between pictures about 1/15 s apart (`frame_step`), several pairs at a time
(`estimate_vectors`).
The vectors come out as FFmpeg's ``AVMotionVector`` records, so the same rules (`BlockMotion`:
``persistent``, ``paper``, ``max``) and noise floor judge them as they judge H.264's.
"""

from __future__ import annotations

import functools

import av
import numpy as np

from vidsight.ingest.block_search import best_shifts
from vidsight.ingest.colour import luma_codes, sdr_luma
from vidsight.ingest.motion import Cover

# The luma is reduced by a whole factor (at least 2) to about this width: the cost per frame stays
# that of a 160-pixel-wide picture at any size, and a block stays 1/40 of the frame's width.
REDUCED_WIDTH = 160
BLOCK = 4            # block side in reduced pixels: a vector covers scale * BLOCK frame pixels
# A reduced pixel sums four of its scale x scale frame pixels, one per quarter of its rows and of
# its columns (in quarters of the cell): noise halves, at a fraction of the cost of averaging all.
SAMPLES = ((0, 0), (1, 2), (2, 1), (3, 3))
# A block moved when its SAD against the previous frame is above CHANGE_FACTOR times the median
# block's and above MIN_CHANGE_LEVELS per frame pixel (the median is near 0 where an encoder
# skips still blocks, and coding noise then stands out alone). Chosen on `bench motion`'s static
# scenes (seed 1); the tests check scenes of another seed. Where the median block itself changed
# by more than MIN_CHANGE_LEVELS, the whole picture moves (a pan, a zoom, a shaking camera) or
# changed (a cut, the lights): nothing stands out from the median there, and every block that
# changed counts (a pan kept 4 % of its blocks dynamic under the median rule; H.264's vectors keep all).
CHANGE_FACTOR = 3.0
MIN_CHANGE_LEVELS = 1.5
QUARTER_PEL = 4      # vectors in quarter pixels, as H.264's
# A changed block with too little texture for a flow (a flat region an edge entered) moves one
# reduced pixel.
FLAT_DETERMINANT = 1e-3
# Lucas-Kanade's flow holds for motion under about a reduced pixel. Where it leaves over
# `UNEXPLAINED_SHARE` of a moved block's change unexplained (an object moving farther), the block
# is matched against the previous picture (`block_search`); a match at least `FAR_SHIFT` reduced
# pixels away, with under `MATCH_GAIN` times the SAD the block shows unmoved, gives its vector.
# Only on pictures with at most `QUIET_BLOCKS` moved blocks (a still camera's few objects and its
# noise: 14 or fewer in 99 % of the pictures of the bench's noisy photo scenes; bigbuckbunny has more
# in 98 % of its): the search costs per block, and on busy footage (where the flow fails on
# occlusions and deformation too) its many moving blocks keep most tokens anyway. Chosen on
# small objects crossing a noisy still camera (seed 3, 160 and 320 pixels a second at 640 wide, 15
# and 30 fps); the tests check the bench's fast objects of another seed.
UNEXPLAINED_SHARE = 0.5
FAR_SHIFT = 2
MATCH_GAIN = 0.5
QUIET_BLOCKS = 32
# A camera moving this many frame pixels a frame (the whole picture's flow; CodecSight's tau) moves
# every block with it.
CAMERA_MOTION_PX = 0.25
# Pictures a second motion is estimated between: the rate the thresholds above were chosen at
# (`bench motion`'s cameras record 15 fps). A faster camera is estimated every `frame_step`-th
# frame of a GOP (frames 0 to 2, 2 to 4, ... at 25-30 fps): the same time between the pictures
# compared, so an object moves as far from one to the next, and the rule's run of `persist_frames`
# estimates lasts as long (noise stands out between two pictures as often whatever lies between
# them); and the frames between cost nothing (the floor of this path's cost is per picture). The rule
# weighs the motion per frame (`BlockMotion.update`'s ``frames``); a frame between two estimated
# ones reports nothing of its own (the next estimate carries its motion), and a GOP's last frames,
# when they end between two, are not judged.
ESTIMATES_PER_SECOND = 15
# A declared rate above this is not a camera's: FFmpeg guesses a stream's timestamp clock (90 kHz)
# for some network streams, which would leave nearly every frame unjudged.
MAX_CAMERA_FPS = 240
_PLANAR_LUMA = frozenset({"yuv420p", "yuvj420p", "yuv422p", "yuvj422p", "yuv444p", "yuvj444p", "nv12", "gray",
                          "yuv420p10le", "yuv422p10le", "yuv444p10le"})

# FFmpeg's AVMotionVector, as PyAV's MotionVectors.to_ndarray() gives it.
VECTOR_DTYPE = np.dtype({"names": ["source", "w", "h", "src_x", "src_y", "dst_x", "dst_y", "flags", "motion_x",
                                   "motion_y", "motion_scale"],
                         "formats": ["<i4", "u1", "u1", "<i2", "<i2", "<i2", "<i2", "<u8", "<i4", "<i4", "<u2"],
                         "offsets": [0, 4, 5, 6, 8, 10, 12, 16, 24, 28, 32], "itemsize": 40, "aligned": True})
_NO_VECTORS = (np.zeros(0, VECTOR_DTYPE), (np.zeros(0, np.int64),) * 3)


def reduction(width: int) -> int:
    """The factor a ``width``-pixel-wide frame's luma is reduced by per side."""
    return max(2, width // REDUCED_WIDTH)


def frame_step(fps: float) -> int:
    """Frames from one picture motion is estimated from to the next, on a camera recording ``fps``
    (1 where the rate is unknown, or past `MAX_CAMERA_FPS`)."""
    return max(1, int(fps / ESTIMATES_PER_SECOND + 0.5)) if fps <= MAX_CAMERA_FPS else 1


def vector_side(width: int) -> int:
    """The side in frame pixels of the square each estimated vector covers."""
    return reduction(width) * BLOCK


def reduced_shape(height: int, width: int) -> tuple[int, int]:
    """The shape of a ``height`` x ``width`` frame's `reduced_luma`: whole blocks covering the
    frame (`vector_side` squares, as the rule's grid)."""
    side = vector_side(width)
    return -(-height // side) * BLOCK, -(-width // side) * BLOCK


def reduced_luma(frame: av.VideoFrame, out: np.ndarray | None = None) -> np.ndarray:
    """`reduced_shape` int16, reduced ``scale`` times (`reduction`): per reduced pixel, the sum of
    its `SAMPLES` of the luma; written into ``out`` when given (a slot of a batch: no copy to stack it).

    A frame's edge rarely falls on a block's (720 rows reduce to 90: 22 blocks and a half), and
    the last block, part of the rule's grid, must still be judged: it holds the picture's last
    `BLOCK` reduced rows (and columns), overlapping the block before it, so that its change is
    measured over as many pixels as any other's and its noise stands out no more often."""
    codes = None
    if frame.format.name in _PLANAR_LUMA:   # read in place: no conversion
        plane, dtype = frame.planes[0], np.uint16 if frame.format.name.endswith("p10le") else np.uint8
        luma = np.frombuffer(plane, dtype).reshape(-1, plane.line_size // dtype().itemsize)[: frame.height, : frame.width]
        codes = luma_codes(frame)   # 10-bit and HDR values, read as 8-bit SDR luma where sampled
    else:                           # packed and other formats: FFmpeg's conversion
        luma = sdr_luma(frame)
    scale = reduction(frame.width)
    rows, cols = luma.shape[0] // scale, luma.shape[1] // scale
    luma = luma[: rows * scale, : cols * scale]
    out = np.empty(reduced_shape(frame.height, frame.width), np.int16) if out is None else out
    if rows < BLOCK or cols < BLOCK:   # smaller than one block: nothing to see motion in
        out[:] = 0
        return out
    first, second, *others = [luma[r * scale // 4 :: scale, c * scale // 4 :: scale] for r, c in SAMPLES]
    if codes is not None:
        first, second, *others = [np.take(codes, picked) for picked in (first, second, *others)]
    sampled = out[:rows, :cols]
    np.add(first, second, out=sampled, dtype=np.int16)
    for picked in others:
        sampled += picked
    height, width = out.shape
    if height > rows:
        out[height - BLOCK :, :cols] = out[rows - BLOCK : rows, :cols]
    if width > cols:
        out[:, width - BLOCK :] = out[:, cols - BLOCK : cols]
    return out


def estimate_vectors(currents: np.ndarray, previouses: np.ndarray, scale: int, frames: int = 1
                     ) -> list[tuple[np.ndarray, Cover]]:
    """Vectors of the blocks of each picture of ``currents`` that moved since the picture of
    ``previouses`` at its index (``(pictures, H, W)``, `reduced_luma`, reduced ``scale`` times),
    ``frames`` frames before.

    Several pairs at once: each step is one numpy call over all of them, whose overhead is most
    of a step's cost on one pair; each pair's vectors are what it gives alone.

    Returns:
        Per pair, an ``AVMotionVector`` array in the full frame's pixels (``source`` -1: from the
        past, ``motion`` pointing from the block to where its content was ``frames`` frames
        before), one record per moving block, and its `destination_blocks` on the grid of
        `vector_side` squares (known here already).
    """
    pairs, rows, cols = len(currents), currents.shape[1] // BLOCK, currents.shape[2] // BLOCK
    if rows == 0 or cols == 0:
        return [_NO_VECTORS] * pairs
    now, before = currents[:, : rows * BLOCK, : cols * BLOCK], previouses[:, : rows * BLOCK, : cols * BLOCK]
    change = now - before
    sad = _block_sum(np.abs(change), rows, cols)
    least, median = MIN_CHANGE_LEVELS * BLOCK * BLOCK * len(SAMPLES), _medians(sad)
    threshold = np.where(median > least, least, np.maximum(CHANGE_FACTOR * median, least))   # per pair
    moved = sad > threshold[:, None, None]
    gradients = _gradients(now + before, change)
    flow = np.zeros((2, *moved.shape), np.float32)
    chosen = np.nonzero(moved)
    terms = _block_terms(gradients, *chosen)
    block_flow = _flow(terms)
    searched = _to_search(terms, block_flow, chosen[0], pairs)
    if len(searched):
        picked = tuple(blocks[searched] for blocks in chosen)
        dy, dx, matched = best_shifts(now, before, *picked, BLOCK)
        far = (np.maximum(np.abs(dy), np.abs(dx)) >= FAR_SHIFT) & (matched < MATCH_GAIN * sad[picked])
        block_flow[:, searched[far]] = -dx[far], -dy[far]   # the flow points from where the content was
    flow[:, moved] = block_flow
    # A moving camera moves every block, including those whose change is too small to stand out
    # (a slow pan changes a textured block little a frame, a flat one not at all): they move with it.
    camera = _camera_flow(gradients, moved)                                # (2, pairs)
    panning = np.hypot(*camera) * scale > CAMERA_MOTION_PX * frames
    still = ~moved & panning[:, None, None]
    flow = np.where(still, camera[:, :, None, None], flow)
    moved_p, moved_r, moved_c = np.nonzero(moved | still)
    u, v = flow[:, moved_p, moved_r, moved_c]
    vectors = np.zeros(len(moved_r), VECTOR_DTYPE)
    side = scale * BLOCK    # `vector_side`
    vectors["source"] = -1
    vectors["w"] = vectors["h"] = side
    vectors["dst_x"], vectors["dst_y"] = moved_c * side + side // 2, moved_r * side + side // 2
    # FFmpeg's convention: src = dst + motion / scale, so motion points back along the flow.
    motion_x = np.rint(-u * scale * QUARTER_PEL).astype(np.int32)
    motion_y = np.rint(-v * scale * QUARTER_PEL).astype(np.int32)
    vectors["motion_x"], vectors["motion_y"], vectors["motion_scale"] = motion_x, motion_y, QUARTER_PEL
    vectors["src_x"] = vectors["dst_x"] + motion_x // QUARTER_PEL
    vectors["src_y"] = vectors["dst_y"] + motion_y // QUARTER_PEL
    bounds = [0, *np.searchsorted(moved_p, np.arange(1, pairs + 1))]   # moved_p is sorted
    return [(vectors[start:end], (np.arange(end - start), moved_r[start:end], moved_c[start:end]))
            for start, end in zip(bounds[:-1], bounds[1:])]


def _gradients(twice_mean: np.ndarray, change: np.ndarray) -> np.ndarray:
    """``(3, pairs, H, W)`` int16: 4 Ix, 4 Iy and It per pixel of each pair, ``twice_mean`` being the
    sums of its two pictures and ``change`` the later less the earlier; central differences of the
    sum (so 4x the mean's gradient, |4 Ix| <= 4080), one-sided at the picture's edges (over one
    pixel, so doubled)."""
    pixels = np.empty((3, *twice_mean.shape), np.int16)
    ix, iy = pixels[0], pixels[1]
    np.subtract(twice_mean[:, :, 2:], twice_mean[:, :, :-2], out=ix[:, :, 1:-1])
    np.subtract(twice_mean[:, :, 1], twice_mean[:, :, 0], out=ix[:, :, 0])
    np.subtract(twice_mean[:, :, -1], twice_mean[:, :, -2], out=ix[:, :, -1])
    ix[:, :, :: ix.shape[2] - 1] *= 2   # the first and last columns
    np.subtract(twice_mean[:, 2:], twice_mean[:, :-2], out=iy[:, 1:-1])
    np.subtract(twice_mean[:, 1], twice_mean[:, 0], out=iy[:, 0])
    np.subtract(twice_mean[:, -1], twice_mean[:, -2], out=iy[:, -1])
    iy[:, :: iy.shape[1] - 1] *= 2      # the first and last rows
    pixels[2] = change
    return pixels


def _flow(terms: np.ndarray) -> np.ndarray:
    """``(2, blocks)``: Lucas-Kanade's flow ``(u, v)`` in reduced pixels over each block of ``terms``
    (`_block_terms`): brightness constancy ``Ix u + Iy v + It = 0`` in the least-squares sense over
    the `_gradients` of the mean picture."""
    # (blocks, 2, 3): rows x, y against x, y, t (einsum: a batched matmul of tiny matrices is several times slower)
    return _solve(np.einsum("ibp,jbp->bij", terms[:2], terms))


def _to_search(terms: np.ndarray, flow: np.ndarray, block_p: np.ndarray, pairs: int) -> np.ndarray:
    """Indices, in order, of the moved blocks (their `_block_terms` and ``flow``; ``block_p`` the
    pair of each, of ``pairs``) to match (`block_search`): on pairs with at most `QUIET_BLOCKS` of
    them, those whose ``flow`` leaves over `UNEXPLAINED_SHARE` of their change unexplained,
    ``sum((Ix u + Iy v + It)^2) / sum(It^2)``. Decided per pair, so that a pair's vectors do not
    depend on the pairs estimated with it."""
    quiet = np.nonzero((np.bincount(block_p, minlength=pairs) <= QUIET_BLOCKS)[block_p])[0]
    if len(quiet) == 0:
        return quiet
    x, y, t = terms[:, quiet]
    u, v = flow[:, quiet, None]
    error = (x * u + y * v) / 4 + t   # 4 Ix and 4 Iy
    unexplained = (error * error).sum(axis=1) / np.maximum((t * t).sum(axis=1), 1e-6)
    return quiet[unexplained > UNEXPLAINED_SHARE]


def _block_terms(gradients: np.ndarray, block_p: np.ndarray, block_r: np.ndarray, block_c: np.ndarray) -> np.ndarray:
    """``(3, blocks, BLOCK * BLOCK)`` float32: the `_gradients` of each chosen block's pixels."""
    # Few small arrays per frame: every step here is a numpy call's overhead more than its work, so
    # only the chosen blocks' pixels are gathered and converted.
    _, pairs, height, width = gradients.shape
    corners = ((block_p * height + block_r * BLOCK) * width + block_c * BLOCK)[:, None] + _block_offsets(width)
    return np.take(gradients.reshape(3, -1), corners, axis=1).astype(np.float32)


def _camera_flow(gradients: np.ndarray, moved: np.ndarray) -> np.ndarray:
    """``(2, pairs)``: one Lucas-Kanade flow over each pair's whole picture but its ``moved`` blocks
    (the objects moving on it), in reduced pixels: the camera's motion. Every other pixel of every
    other row is enough: a thousand pixels and more average the noise out."""
    pairs, height, width = gradients.shape[1:]
    step = BLOCK // 2
    background = ~np.repeat(np.repeat(moved, step, axis=1), step, axis=2)         # (pairs, H / 2, W / 2)
    terms = gradients[:, :, ::2, ::2] * background                                 # (3, pairs, H / 2, W / 2)
    terms = terms.reshape(3, pairs, -1).astype(np.float32).transpose(1, 0, 2)      # (pairs, 3, pixels)
    return _solve(terms[:, :2] @ terms.transpose(0, 2, 1), flat=0.0)   # a flat picture shows no camera motion


def _solve(sums: np.ndarray, flat: float = 1.0) -> np.ndarray:
    """``(2, n)`` flows from ``(n, 2, 3)`` sums of 4 Ix, 4 Iy against 4 Ix, 4 Iy, It: where the
    gradients are too flat for a flow, ``flat`` reduced pixels across (a block's default: a flat
    region an edge entered)."""
    sums = sums * _GRADIENT_SCALE   # central differences (/2) of half the sum (/2)
    xx, xy, xt, yy, yt = sums[:, 0, 0], sums[:, 0, 1], sums[:, 0, 2], sums[:, 1, 1], sums[:, 1, 2]
    determinant = xx * yy - xy * xy
    textured = determinant > FLAT_DETERMINANT * (xx + yy) ** 2 + 1e-6
    safe = np.where(textured, determinant, 1.0)
    u = np.where(textured, -(yy * xt - xy * yt) / safe, flat)
    v = np.where(textured, -(xx * yt - xy * xt) / safe, 0.0)
    return np.stack([u, v]).astype(np.float32)


_GRADIENT_SCALE = np.array([[1 / 16, 1 / 16, 1 / 4], [1 / 16, 1 / 16, 1 / 4]], np.float32)


@functools.cache
def _block_offsets(width: int) -> np.ndarray:
    """Flat offsets of a block's pixels from its top-left one, in a ``width``-wide picture."""
    return (np.arange(BLOCK)[:, None] * width + np.arange(BLOCK)).reshape(-1)


def _medians(values: np.ndarray) -> np.ndarray:
    """``np.median`` of each picture's values (``(pictures, rows, cols)`` ints), without its overhead."""
    flat = values.reshape(len(values), -1)
    middle = flat.shape[1] // 2
    if flat.shape[1] % 2:
        return np.partition(flat, middle, axis=1)[:, middle].astype(np.float64)
    ordered = np.partition(flat, (middle - 1, middle), axis=1)
    return (ordered[:, middle - 1].astype(np.int64) + ordered[:, middle]) / 2


def _block_sum(values: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Sums over ``BLOCK x BLOCK`` blocks of each picture, by strided adds (a reshaped sum is
    several times slower)."""
    by_rows = sum(values[:, k : rows * BLOCK : BLOCK] for k in range(BLOCK))
    return sum(by_rows[:, :, k : cols * BLOCK : BLOCK] for k in range(BLOCK))


class PixelMotion:
    """Vectors of each frame of one stream from its pixels: frames added in presentation order
    (those an estimate reads reduced at once, while their pixels are at hand, into consecutive
    slots of one array), their vectors estimated together when taken.

    Args:
        step: Frames between the two pictures of an estimate (`frame_step`; 1: every frame).
    """

    def __init__(self, step: int = 1):
        self.step = step
        self._since_key: int | None = None   # frames since the GOP's I-frame (or the stream's first frame)
        self._estimates: list = []           # per frame added since the last take (None until estimated)
        # Reduced pictures, (slots, H, W) int16; slot 0 holds the last one before these frames.
        self._pictures: np.ndarray | None = None
        self._scale = 0
        self._used = 0                       # slots holding pictures
        # (place among the frames added, slot) of each picture to compare with the slot before it.
        self._pending: list[tuple[int, int]] = []

    def add(self, frame: av.VideoFrame, kind: str) -> None:
        start = kind == "I" or self._since_key is None
        self._since_key = 0 if start else self._since_key + 1
        if self._since_key % self.step:
            self._estimates.append(Between)
            return
        shape, scale = reduced_shape(frame.height, frame.width), reduction(frame.width)
        if self._pictures is None or self._pictures.shape[1:] != shape or self._scale != scale:
            self._estimate_pending()
            self._pictures, self._scale, self._used = np.empty((2, *shape), np.int16), scale, 0
            start = True   # nothing of another size to compare with
        elif self._used == len(self._pictures):   # doubled until a batch and the picture before it fit
            self._pictures = np.concatenate([self._pictures, np.empty_like(self._pictures)])
        reduced_luma(frame, out=self._pictures[self._used])
        if not start:
            self._pending.append((len(self._estimates), self._used))
        self._estimates.append(None)
        self._used += 1

    def take(self) -> list[tuple[np.ndarray, Cover] | None | type[Between]]:
        """Per frame added since the last take, in order: its `estimate_vectors`; `Between` for a
        frame between two estimated ones; None for an I-frame, as a codec gives none (so a decoder
        that starts at a keyframe sees what one that ran into it sees), and a stream's first frame."""
        self._estimate_pending()
        estimates, self._estimates = self._estimates, []
        return estimates

    def _estimate_pending(self) -> None:
        """Estimate the pending pictures' vectors and keep only the last picture (in slot 0)."""
        if self._pending:
            # Every slot from the first pending one on is compared with the slot before it, in
            # one call on two views of the array; a slot no estimate asks for (an I-frame's) is dropped.
            first, last = self._pending[0][1], self._pending[-1][1]
            pictures = self._pictures
            found = estimate_vectors(pictures[first : last + 1], pictures[first - 1 : last], self._scale, self.step)
            for place, slot in self._pending:
                self._estimates[place] = found[slot - first]
            self._pending = []
        if self._used > 1:
            self._pictures[0] = self._pictures[self._used - 1]
            self._used = 1


class Between:
    """`PixelMotion.take`'s mark for a frame between two estimated ones: the next estimate carries its motion."""
