"""`vidsight train`: the small task model, trained on generated videos."""

from __future__ import annotations

import argparse
import logging
import sys


def add_train_parser(commands, parents: list[argparse.ArgumentParser]) -> None:
    from vidsight.train.config import SCRATCH_LAYERS, TrainConfig

    train = commands.add_parser("train", parents=parents, help="train the small task model on generated videos")
    train.add_argument("--out", default="out/train", help="checkpoints, logs, plots and the model (default: out/train)")
    train.add_argument("--steps", type=int, default=TrainConfig.steps)
    train.add_argument("--seed", type=int, default=TrainConfig.seed)
    train.add_argument("--eval-every", type=int, default=TrainConfig.eval_every)
    train.add_argument("--lr", type=float, default=TrainConfig.lr, help="peak learning rate")
    train.add_argument("--warmup", type=int, default=TrainConfig.warmup, help="warm-up steps")
    train.add_argument("--init", default=None, metavar="MODEL",
                       help="fine-tune this checkpoint instead of starting from random weights")
    train.add_argument("--layers", type=int, default=None, metavar="N",
                       help=f"language-model layers (default: --init's, or {SCRATCH_LAYERS} from scratch); more than "
                            "--init's adds layers after its own, each starting as the identity")
    train.add_argument("--offset-patches", type=int, default=TrainConfig.offset_patches, metavar="N",
                       help="clips start up to N temporal patches into a stream (default: 0, at the start)")
    train.add_argument("--chat-frames", type=int, nargs="*", default=list(TrainConfig.chat_frames), metavar="F",
                       help="train on chat-suite streams of these lengths too (every other step)")
    train.add_argument("--chat-questions", nargs="*", default=[], metavar="FAMILY",
                       help="chat steps ask these families (colour, shape, order, order-adjacent; repeat to weight; "
                            "default: the streams' own questions)")
    train.add_argument("--order-weight", type=float, default=TrainConfig.order_weight, metavar="W",
                       help="weight of the training-only probe on objects' order of appearance (default: 0, off)")
    train.add_argument("--retrieval-weight", type=float, default=TrainConfig.retrieval_weight, metavar="W",
                       help="weight of the training-only loss pointing a chat question's mean query at the "
                            "patches it is about, as frame retrieval scores them (default: 0, off)")
    train.add_argument("--attention-weight", type=float, default=TrainConfig.attention_weight, metavar="W",
                       help="weight of the training-only loss asking one head of the first layers to attend, "
                            "at a chat question's key word, to the patches it is about (default: 0, off)")
    train.add_argument("--mrope-section", type=int, nargs=3, default=list(TrainConfig.mrope_section),
                       metavar=("T", "H", "W"), help="rotary frequency pairs per axis, 16 in all (default: "
                       + " ".join(map(str, TrainConfig.mrope_section)) + ")")
    train.add_argument("--rope-theta", type=float, default=TrainConfig.rope_theta,
                       help=f"the rotary embedding's base (default: {TrainConfig.rope_theta:g})")
    train.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    train.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda when available)")
    train.add_argument("--export", action="store_true", help="only write OUT/model from OUT/checkpoint.pt")
    train.set_defaults(run=run_train)


def run_train(args) -> int:
    from vidsight.train import TrainConfig, export_checkpoint, train

    if args.export:
        print(export_checkpoint(args.out, seed=args.seed))
        return 0
    config = TrainConfig(steps=args.steps, seed=args.seed, eval_every=args.eval_every, lr=args.lr,
                         warmup=args.warmup, init=args.init, layers=args.layers,
                         offset_patches=args.offset_patches, chat_frames=tuple(args.chat_frames),
                         chat_questions=tuple(args.chat_questions), order_weight=args.order_weight,
                         retrieval_weight=args.retrieval_weight,
                         attention_weight=args.attention_weight, mrope_section=tuple(args.mrope_section),
                         rope_theta=args.rope_theta)
    logging.getLogger("vidsight.train").setLevel(logging.INFO)
    print(train(args.out, config, resume=args.resume, progress=sys.stderr.isatty(), device=args.device))
    return 0
