"""Stand-ins for the servers that cannot run on a developer machine or in CI.

Each one reproduces the real server's wire behaviour that loraflow depends on, and its tests
drive it with the real clients (kubectl and the `kubernetes` package, httpx, boto3):
`kube/` (the Kubernetes API), `engines/` (vLLM and SGLang replicas), and, until the real
SeaweedFS replaces them, `filer*.py`, `notifications.py` and `sqs_bridge.py`.
"""
