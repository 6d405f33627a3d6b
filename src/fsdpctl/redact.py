"""Secrets never reach a terminal or a file: the values of known secret variables, and anything shaped like a
Hugging Face token or an AWS access key, are masked in whatever fsdpctl prints."""

from __future__ import annotations

import os
import re

SECRET_ENV = (
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_ACCESS_KEY_ID",
    "AWS_SESSION_TOKEN",
)
SHAPES = (re.compile(r"hf_[A-Za-z0-9]{20,}"), re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"))
MASK = "***"


def redact(text: str, extra: tuple[str, ...] = ()) -> str:
    for value in (*extra, *(os.environ.get(k, "") for k in SECRET_ENV)):
        if value and len(value) >= 8:
            text = text.replace(value, MASK)
    for shape in SHAPES:
        text = shape.sub(MASK, text)
    return text
