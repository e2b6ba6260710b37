"""The proving daemon's gRPC: the client, one proof's loop, batches, the channel, deadlines and
retry policies, errors, results, and proof inputs."""
