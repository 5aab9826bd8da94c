"""Tests of ``stability.design``: the factor vocabulary, the Design, the margin."""
