"""Turn an encoded image (PNG, JPEG, anything Pillow reads) into the 64 features of the digits classifier.

Shipped inside preprocess.zip beside model.py (a helper module of a python-backend model): it runs in Triton's
python environment, so it needs only numpy and Pillow and imports nothing from the portal.

scikit-learn's `load_digits` images are 32x32 bitmaps of ink, counted in 4x4 blocks: 8x8 values from 0 (paper)
to 16 (all ink), strokes bright on a dark background. An ordinary picture of a digit is dark ink on light paper,
so the image is inverted when it is mostly light, then averaged down to 8x8 and scaled to 0..16.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

SIDE = 8
MAX_INK = 16.0
# Larger images are refused rather than decoded: a digit needs no more, and a decompression bomb gets nowhere.
MAX_PIXELS = 4096 * 4096


class NotAnImage(ValueError):
    """The caller sent bytes that are no image this model takes; the message says so in words about the input."""


def digit_features(data: bytes) -> np.ndarray:
    """float32 [64], values 0..16, ink bright: what digits.onnx takes as one row. NotAnImage for bytes that are no
    readable image (Pillow's own message names an in-memory object's address: it is not passed on)."""
    try:
        image = Image.open(io.BytesIO(data))
    except (UnidentifiedImageError, OSError, ValueError):
        raise NotAnImage(f"the input 'image' is not an image file (PNG, JPEG, ...): {len(data)} bytes that "
                         "Pillow cannot read; send the encoded file's bytes, one image per row") from None
    with image:
        if image.width * image.height > MAX_PIXELS:
            raise NotAnImage(f"the image is {image.width}x{image.height} pixels; at most {MAX_PIXELS} are "
                             "accepted")
        picture: Image.Image = image
        try:
            picture.load()
        except (OSError, ValueError, SyntaxError):
            raise NotAnImage("the input 'image' is a truncated or corrupt image file; send the whole "
                             "file's bytes") from None
        if picture.mode in ("RGBA", "LA", "PA") or (picture.mode == "P" and "transparency" in picture.info):
            # Transparent parts are paper: put the image on white before it loses its alpha channel.
            rgba = picture.convert("RGBA")
            picture = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
        gray = np.asarray(picture.convert("L"), dtype=np.float32) / 255.0
    ink = 1.0 - gray if gray.mean() > 0.5 else gray
    # BOX averages whole source pixels per target pixel: for a 32x32 image, exactly the dataset's 4x4 blocks.
    small = Image.fromarray(ink.astype(np.float32)).resize((SIDE, SIDE), Image.Resampling.BOX)
    features = np.clip(np.asarray(small, dtype=np.float32) * MAX_INK, 0.0, MAX_INK)
    return features.reshape(SIDE * SIDE)
