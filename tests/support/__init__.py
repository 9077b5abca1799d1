"""What the test tiers (and bench/) share: the testbed, the stack client, one `eventually`,
the JSON-Schema export of our records and the scenario builders. Fixtures stay in conftest."""
