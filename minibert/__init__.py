"""minibert: a from-scratch, minimal-dependency BERT in pure PyTorch."""

__version__ = "0.1.0"
