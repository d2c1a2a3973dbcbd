"""Model definitions, data sets and training helpers."""
