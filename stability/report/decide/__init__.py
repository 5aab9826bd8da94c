"""Weigh and decide: config aggregates, factor effects, adaptive replay, winner, how sure, cost."""
