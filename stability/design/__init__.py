"""The study's design in one room: its factors, their levels and names, and the margin.

``factors`` is the vocabulary (one registry entry per first-class factor), ``design`` the
factors that vary in a study and each config's cell (built from a sweep's grid or from fetched
runs by one function), ``margin`` the equivalence margin's syntax. The sweep and the report
read them from here; nothing here reads a tracker.
"""
