"""Schedules measured where the model trains: runs under memprof, their comparison with the prediction,
the host link's bandwidth, torch.compile's partitioner as a baseline, and the largest batch that fits."""
