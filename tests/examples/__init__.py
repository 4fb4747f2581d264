"""Tests of the README's snippets and the examples' recipes, on real servers over loopback."""
