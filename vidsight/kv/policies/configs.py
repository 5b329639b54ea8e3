"""The retrieval policies' settings: torch-free, so the command line and the server read them cheaply.

A field with ``flag`` metadata becomes a command-line flag (and a server setting of the same
name), its help followed by the default read from the field; a flag several policies declare for
the same field sets it in each. ``switch`` marks a flag that takes no value and sets the field to
``switch``. Fields without a flag are still settable by label, ``mosaic:rotated=false``.
"""

from __future__ import annotations

import dataclasses

from vidsight.errors import ConfigError


def flag(name: str, default, help: str, switch=None):
    """A config field that the command line and the server expose as ``name``."""
    metadata = {"flag": name, "help": help}
    if switch is not None:
        metadata["switch"] = switch
    return dataclasses.field(default=default, metadata=metadata)


LOCAL_HELP = "local window in tokens every step attends to"


@dataclasses.dataclass(frozen=True)
class RecentConfig:
    """A local window with attention sinks (StreamingLLM, Xiao et al., ICLR 2024).

    Attributes:
        window_tokens: The most recent cached tokens every step attends to.
    """

    window_tokens: int = flag("--window-tokens", 4096, "local window in tokens")

    def __post_init__(self):
        if self.window_tokens < 1:
            raise ConfigError(f"window_tokens must be positive, got {self.window_tokens}")


@dataclasses.dataclass(frozen=True)
class ReKVConfig:
    """ReKV's retrieval (its released defaults: a 15000-token local window, 64 retrieved frames).

    Attributes:
        local_tokens: The most recent cached tokens every step attends to (ReKV's ``n_local``).
        top_frames: Frame blocks retrieved per layer at a question (ReKV's ``retrieve_size``); a
            block here is one temporal patch (two frames for Qwen2.5-VL).
        rotated: Score blocks with keys and queries after the rotary embedding. ReKV's code
            scores them before it (its context memory keeps keys unrotated), so blocks are
            compared by content alone, wherever they sit in the stream; the default follows it.
    """

    local_tokens: int = flag("--local-tokens", 15000, LOCAL_HELP)
    top_frames: int = flag("--top-frames", 64, "frame blocks retrieved at a question")
    rotated: bool = False

    def __post_init__(self):
        if self.local_tokens < 1 or self.top_frames < 1:
            raise ConfigError("local_tokens and top_frames must be positive")


MOSAIC_CLUSTERINGS = ("nested", "visual", "semantic", "none")
MOSAIC_SPLITS = ("deferred", "eager")


@dataclasses.dataclass(frozen=True)
class MosaicConfig:
    """Mosaic's settings. The paper's thresholds did not survive extraction; ours are named here,
    chosen from the task model's keys: one temporal patch of background has a cosine variance
    of 0.006 (layer 0) to 0.07 (layer 3), a patch with an object 0.25 to 0.39.

    Attributes:
        local_tokens: The most recent cached tokens every step attends to (ReKV's window, so the
            two compare at the same one).
        top_frames: The retrieval budget, in temporal patches' worth of tokens (ReKV's 64 frames).
        visual_top: Visual partitions searched at the second stage.
        tau_small: Variance threshold of a one-token cluster (the stricter one).
        tau_large: Variance threshold of a large cluster (the looser one).
        tau_rate: Cluster size over which the threshold moves from ``tau_small`` to ``tau_large``.
        visual_tau: Variance threshold of a visual cluster. Pooled frame embeddings vary far
            less than keys (consecutive frames of one shot are nearly identical); at 0.002 the
            chat suite's streams (two to four shots, three brief objects each) form about five
            visual clusters, at 0.01 under three, merging the frames that show an object into
            their shot (the sweep: docs/benchmarks.md).
        min_split_size: Clusters smaller than this are never split (the paper: small clusters are
            unstable and should not be split aggressively).
        max_clusters: Semantic clusters per visual partition and layer past which none is split:
            a split reads every member, so without a cap keys that are all far apart (random
            weights) would split on every patch.
        clustering: ``nested`` (Mosaic), or an ablation: ``visual`` (frames only), ``semantic``
            (keys only, one partition), ``none`` (token-level top-k over every video key).
        split: ``deferred`` (Algorithm 1: wait until the cluster is fetched) or ``eager``.
        summaries: Attend to the representatives of the clusters not retrieved.
        prefetch: Predict layer l+1's clusters from layer l's query and count the hits.
        rotated: Cluster and score keys and queries as the cache holds them, after the rotary
            embedding (Mosaic does not say which). False compares them before it, as ReKV's code
            scores; the thresholds above were chosen on rotated keys, and before rotation the same
            thresholds leave a few large clusters (measured in docs/benchmarks.md), so the default
            stays rotated. Summaries are rotated keys either way.
    """

    local_tokens: int = flag("--local-tokens", 15000, LOCAL_HELP)
    top_frames: int = flag("--top-frames", 64, "token budget, in frame blocks' worth")
    visual_top: int = flag("--visual-top", 4, "visual partitions searched")
    tau_small: float = flag("--tau-small", 0.05, "variance threshold of small clusters")
    tau_large: float = flag("--tau-large", 0.15, "variance threshold of large clusters")
    tau_rate: float = flag("--tau-rate", 16.0, "cluster size of the threshold's transition")
    visual_tau: float = flag("--visual-tau", 0.002, "variance threshold of visual clusters")
    min_split_size: int = flag("--min-split-size", 32, "clusters smaller than this never split")
    max_clusters: int = flag("--max-clusters", 64, "semantic clusters per visual partition and layer before splits stop")
    clustering: str = flag("--clustering", "nested", "nested (Mosaic), or an ablation: visual, semantic, "
                                                      "none (token-level top-k)")
    split: str = flag("--split", "deferred", "deferred (Algorithm 1) or eager")
    summaries: bool = flag("--no-summaries", True, "no representatives of unretrieved clusters", switch=False)
    prefetch: bool = flag("--no-prefetch", True, "no cross-layer prediction", switch=False)
    rotated: bool = True

    def __post_init__(self):
        if min(self.local_tokens, self.top_frames, self.visual_top, self.min_split_size, self.max_clusters) < 1 \
                or self.tau_rate <= 0:
            raise ConfigError("local_tokens, top_frames, visual_top, min_split_size, max_clusters and tau_rate "
                              "must be positive")
        if not 0 < self.tau_small <= self.tau_large <= 2 or not 0 < self.visual_tau <= 2:
            raise ConfigError("need 0 < tau_small <= tau_large <= 2 (cosine variances lie in [0, 2])")
        if self.clustering not in MOSAIC_CLUSTERINGS or self.split not in MOSAIC_SPLITS:
            raise ConfigError(f"clustering must be one of {MOSAIC_CLUSTERINGS} and split one of {MOSAIC_SPLITS}")


RESV_SELECTIONS = ("wicsum", "topk")
RESV_WEIGHTS = ("score", "attention")
RESV_ROWS = ("tokens", "mean", "max")


@dataclasses.dataclass(frozen=True)
class ReSVConfig:
    """ReSV's settings (the paper's: 32 hyperplanes, Th_hp 7, Th_r-wics 0.3).

    Attributes:
        hyperplanes: Random hyperplanes, so hash bits per key (at most 62).
        hamming_threshold: A token joins a cluster whose bits differ in fewer places.
        ratio: WiCSum's Th_r-wics: the share of each row's weighted score the kept clusters
            must pass; 1 or more keeps every cluster.
        seed: Seeds the hyperplanes (fixed per session).
        local_tokens: The most recent tokens every step attends to besides the selection (0:
            none, as in V-Rex).
        clustering: False attends the ablation without clusters: WiCSum over every token.
        selection: ``wicsum``, or the ablation ``topk``: the ``top_clusters`` best clusters per row.
        top_clusters: Clusters per row for ``topk``.
        weights: What WiCSum weighs a cluster by, times its count: ``score``, its score as eqs. 1-3
            write it (clamped at 0), or ``attention``, ``exp`` of its scaled score less the row's
            best, so the kept clusters carry ``ratio`` of the row's softmax attention mass.
        rows: WiCSum's rows: ``tokens``, every query of the step (each token, each query head of
            the key head's group: the paper's), ``mean``, one per query head, its queries' mean
            over the step's tokens (as ReKV scores a question), or ``max``, one per query head
            scoring each cluster by the step's best token for it. The union over ``tokens`` rows
            grows with the step's length; a ``mean`` row keeps what the step attends to as a whole,
            a ``max`` row what any token of it attends to most.
        mean_frame_rows: Frame steps score with ``mean`` rows whatever ``rows`` says: a temporal
            patch has hundreds of rows per key head on a real model (64 tokens x 7 query heads on
            Qwen2.5-0.5B's), and scoring and ranking every one against every cluster costs more
            than the attention it saves; a question keeps its ``rows``.
        prefetch: Each layer's rows also predict the next layer's clusters, whose offloaded
            blocks start moving up early (with tiered KV only; what is attended never changes).
        layout: Offloaded KV laid out by cluster, per key head (V-Rex's cluster-wise memory
            mapping), so a selected cluster moves as one block; False keeps the patch blocks.
    """

    hyperplanes: int = flag("--hyperplanes", 32, "random hyperplanes, bits per key hash")
    hamming_threshold: int = flag("--hamming-threshold", 7, "a key joins a cluster whose hash differs in fewer bits")
    ratio: float = flag("--wics-ratio", 0.3, "WiCSum's Th_r-wics (1 keeps everything)")
    seed: int = 0
    local_tokens: int = flag("--local-tokens", 0, LOCAL_HELP)
    clustering: bool = True
    selection: str = "wicsum"
    top_clusters: int = 8
    weights: str = flag("--wics-weights", "score", "WiCSum weighs clusters by score (eqs. 1-3) or by attention "
                                                   "(exp of the scaled score)")
    rows: str = flag("--wics-rows", "tokens", "WiCSum's rows: tokens (every query of a step), or one per query "
                                              "head: mean (of its queries) or max (each cluster's best score)")
    mean_frame_rows: bool = flag("--mean-frame-rows", False, "frame steps score one mean row per query head "
                                                             "(questions keep --wics-rows)", switch=True)
    prefetch: bool = flag("--no-prefetch", True, "no cross-layer prediction", switch=False)
    layout: bool = True

    def __post_init__(self):
        if not 1 <= self.hyperplanes <= 62 or self.hamming_threshold < 1 or self.ratio <= 0:
            raise ConfigError("hyperplanes must be in [1, 62], hamming_threshold at least 1 and ratio positive")
        if self.local_tokens < 0 or self.top_clusters < 1 or self.selection not in RESV_SELECTIONS:
            raise ConfigError(f"local_tokens must be >= 0, top_clusters >= 1, selection one of {RESV_SELECTIONS}")
        if self.weights not in RESV_WEIGHTS or self.rows not in RESV_ROWS:
            raise ConfigError(f"weights must be one of {RESV_WEIGHTS} and rows one of {RESV_ROWS}")
