"""A consumer's filter on one topic: RocketMQ's SubscriptionData (FilterAPI.build).

A subscription is a TAG expression (``*``, or ``A || B``: the tags and their
Java ``String.hashCode``s, which the broker matches against each record's
tag hash) or an SQL92 expression (the broker evaluates it on properties).
It goes to brokers in heartbeats and, with ``post_subscription_when_pull``,
in each pull; ``accepts`` is the client's second look after a pull, because
the broker's tag-hash match lets through a tag whose hash collides.
Push and lite pull consumers both build them here; nothing here does I/O.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from shmq.core.layout import java_string_hash

from .message import MessageExt

_JAVA_BLANKS = "".join(map(chr, range(33)))  # what String.trim strips


@dataclass
class SubscriptionData:
    """A topic's filter (FilterAPI.build): TAG (``*`` or ``a || b``) or SQL92."""
    topic: str
    sub_string: str
    expression_type: str = "TAG"
    tags_set: list[str] = field(default_factory=list)
    code_set: list[int] = field(default_factory=list)
    sub_version: int = field(default_factory=lambda: int(time.time() * 1000))

    @classmethod
    def build(cls, topic: str, expression: str | None = "*",
              expression_type: str | None = "TAG") -> "SubscriptionData":
        etype = (expression_type or "TAG").upper()
        if etype not in ("TAG", "SQL92"):
            raise ValueError(f"expression type {expression_type!r}: TAG or SQL92")
        if etype == "SQL92":
            if not expression:
                raise ValueError(f"Expression can't be null! {etype}")
            return cls(topic, expression, etype)
        if not expression or expression == "*":
            return cls(topic, "*")
        tags = []
        for piece in expression.split("||"):
            tag = piece.strip(_JAVA_BLANKS)
            if tag and tag not in tags:
                tags.append(tag)
        return cls(topic, expression, "TAG", tags, list(dict.fromkeys(map(java_string_hash, tags))))

    def to_json(self) -> dict:
        return {"classFilterMode": False, "topic": self.topic, "subString": self.sub_string,
                "tagsSet": self.tags_set, "codeSet": self.code_set, "subVersion": self.sub_version,
                "expressionType": self.expression_type}

    def accepts(self, msg: MessageExt) -> bool:
        """The client's second look (PullAPIWrapper.processPullResult): the
        broker matched tag hashes; keep only messages whose tag is listed."""
        return not self.tags_set or msg.tags in self.tags_set


__all__ = ["SubscriptionData"]
