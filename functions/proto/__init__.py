"""SeaweedFS's filer gRPC messages (`filer_pb`), generated from filer.proto beside this file.

`filer_pb2` is generated code, committed (tests/support/protogen.py says why and how to
regenerate it; tests/unit/test_filer_proto.py fails when it is stale). Import it where a
protobuf message is read or written, never at module level of a cold-start path: importing
the protobuf runtime costs a few milliseconds that only the filer source and ingest's aws-sqs
path need.
"""
