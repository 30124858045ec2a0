"""fxkit: provision MI308X inference nodes Ansible-style in Python, and load models fast."""

__version__ = "0.1.0"
