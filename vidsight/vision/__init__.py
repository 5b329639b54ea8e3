"""Frames to visual tokens."""

from vidsight.vision.preprocess import VideoInput, preprocess_video, resize_frames, smart_resize, video_size

__all__ = ["VideoInput", "preprocess_video", "resize_frames", "smart_resize", "video_size"]
