"""How vidsight quiets the libraries it drives, in one place: the command line and the device
check's stage forker (`bench/forked.py`) both call it before transformers is imported."""

import logging
import os


def quiet_libraries() -> None:
    """Silence transformers' load bars and FFmpeg's decoder chatter: vidsight reports losses itself."""
    import av

    # Read by transformers and huggingface_hub when (and if) a command imports them.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # FFmpeg's own level, not PyAV's callback: that callback takes the GIL from decoder threads
    # and deadlocks when a frame-threaded decoder is freed.
    av.logging.set_libav_level(av.logging.PANIC)
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
