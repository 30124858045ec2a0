"""Facts about hosts: a command plus a parser, cached per host per run."""

from fxkit.facts.base import Fact, FactCache

__all__ = ["Fact", "FactCache"]
