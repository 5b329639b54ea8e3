"""The one exception family users see for bad input."""


class VidsightError(Exception):
    """Bad input or an unusable resource: the message names the input and the problem.

    The CLI turns it into exit status 2 with the message and no traceback.
    """


class VideoError(VidsightError):
    """A video file that is missing, empty, corrupt, or has no decodable video stream."""


class ModelError(VidsightError):
    """A model id or directory that cannot be loaded as a supported VLM."""


class ConfigError(VidsightError):
    """A configuration value outside its valid range."""
