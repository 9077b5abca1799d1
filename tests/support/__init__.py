"""What the test tiers (and bench/) share: the testbed, the stack client, one `eventually`,
the CRDs as JSON Schema and the scenario builders. Fixtures stay in conftest."""
