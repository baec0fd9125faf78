"""The pure core: the chain of phases that judges one assembled call, and the record processor."""
