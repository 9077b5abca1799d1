"""Stand-ins for the servers that cannot run on a developer machine or in CI: the vLLM and
SGLang engines (`engines/`), which reproduce the real engines' wire behaviour that loraflow
depends on, each behaviour citing the upstream code it mirrors. Kubernetes and SeaweedFS are
the real servers (devstack.kubernetes, devstack.seaweedfs)."""
