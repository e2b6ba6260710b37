"""Generated gRPC stubs for the cuzk.v1 ProvingEngine service (do not edit the *_pb2* files)."""
