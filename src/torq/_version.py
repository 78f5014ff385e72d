"""The package version (a leaf: sub-packages read it without importing the torq face).
May import: nothing.
"""
__version__ = "0.1.0"
