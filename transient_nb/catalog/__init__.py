"""What the world offers and what the paper measured: price catalogs, GPU mixes, Spot lifetime models."""
