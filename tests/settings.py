"""Where the tests run: `VIDSIGHT_TEST_DEVICE` (cpu, cuda, cuda:N) and `VIDSIGHT_TEST_DTYPE`
(float32, bfloat16) move every model the shared fixtures load, so the exactness tests run on a GPU
through this one switch (the device check's CUDA subset, `-m device_check`), not as copies.

Tolerances: in float32, greedy ids are identical and first-token logits within 1e-4 of the
reference. In bfloat16 (the stated tolerance of `test_ask_exact.py`), first-token logits are within
2**-6 of the reference's largest magnitude, and the first greedy id is equal unless the reference's
two best logits are closer than twice that (later ids follow from a different rounding of the
context, so they are not compared).
"""

from __future__ import annotations

import os

import torch

DEVICE = torch.device(os.environ.get("VIDSIGHT_TEST_DEVICE", "cpu"))
DTYPE = {"float32": torch.float32, "bfloat16": torch.bfloat16}[os.environ.get("VIDSIGHT_TEST_DTYPE", "float32")]
FLOAT32_TOLERANCE = 1e-4
BF16_RELATIVE_TOLERANCE = 2**-6  # about two bfloat16 steps of the largest logit

if DEVICE.type == "cuda":
    # The references are the definitions in full float32; TF32 convolutions and products would
    # measure cuDNN's rounding, not vidsight's.
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def on_device(inputs: dict) -> dict:
    """Transformers' inputs moved to the test device, pixel values in the test dtype."""
    return {k: (v.to(DEVICE, DTYPE) if k.startswith("pixel_values") else v.to(DEVICE)) if torch.is_tensor(v) else v
            for k, v in inputs.items()}


def logits_tolerance(reference: torch.Tensor, atol: float = FLOAT32_TOLERANCE) -> float:
    """How far first-token logits may be from ``reference`` in the test dtype."""
    if DTYPE == torch.float32:
        return atol
    return BF16_RELATIVE_TOLERANCE * float(reference.float().abs().max())


def assert_logits_close(ours: torch.Tensor, reference: torch.Tensor, atol: float = FLOAT32_TOLERANCE) -> None:
    ours, reference = ours.float().cpu(), reference.float().cpu()
    tolerance = logits_tolerance(reference, atol)
    assert (ours - reference).abs().max() <= tolerance, f"logits differ by {(ours - reference).abs().max():.3g}"


def logits_error(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest difference between first-token logits and their reference's."""
    return float((ours.float().cpu().reshape(-1) - reference.float().cpu().reshape(-1)).abs().max())


def assert_input_matters(logits: torch.Tensor, changed: torch.Tensor, error: float,
                         atol: float = FLOAT32_TOLERANCE) -> None:
    """Logits of a changed input (another question, video or window) lie further from the reference
    ``logits`` than the tolerance plus ``error`` (`logits_error` of the logits compared with them): a
    computation as far off on the changed input would fail the exactness comparison beside it.

    In bfloat16 the tolerance is a share of the largest logit, and the tiny random models' logits
    move little with their input, so the margin is the error seen, not a second tolerance.
    """
    gap = float((logits.float().cpu().reshape(-1) - changed.float().cpu().reshape(-1)).abs().max())
    needed = logits_tolerance(logits, atol) + error
    assert gap > needed, f"a changed input moved the logits by {gap:.3g} only (the comparison passes within {needed:.3g})"


def assert_same_answer(ours_ids, ours_logits, reference_ids, reference_logits, atol: float = FLOAT32_TOLERANCE):
    """The greedy answer and its first-token logits agree within the test dtype's tolerance."""
    assert_logits_close(ours_logits, reference_logits, atol)
    if DTYPE == torch.float32:
        assert list(ours_ids) == list(reference_ids)
        return
    best, second = torch.topk(reference_logits.float().reshape(-1), 2).values
    if best - second > 2 * logits_tolerance(reference_logits):
        assert list(ours_ids)[:1] == list(reference_ids)[:1]


def assert_same_greedy_ids(ours, reference, reference_step_logits) -> None:
    """Greedy ids equal the reference's; in bfloat16, up to a step where the reference's own two best
    logits were within twice the tolerance (a near tie that another rounding may break either way)."""
    ours, reference = list(ours), list(reference)
    if DTYPE == torch.float32:
        assert ours == reference
        return
    for step, (a, b) in enumerate(zip(ours, reference)):
        if a != b:
            logits = reference_step_logits[step].float().reshape(-1)
            best, second = torch.topk(logits, 2).values
            assert best - second <= 2 * logits_tolerance(logits), f"ids differ at step {step} without a near tie"
            return
    assert len(ours) == len(reference)


def exact_answers() -> bool:
    """Whether whole greedy answers are compared (float32), not only their first id (bfloat16)."""
    return DTYPE == torch.float32
