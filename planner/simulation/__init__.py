"""The single judge of what a schedule costs: the memory rules of every operation, the replay of a schedule
through them (copy streams and streamed weights on their own clocks), carried tensors, and the prediction."""
