"""Connections to hosts: SSH (Fabric/paramiko) and local, behind one interface."""

from fxkit.connection.base import Connection, RunResult

__all__ = ["Connection", "RunResult"]
