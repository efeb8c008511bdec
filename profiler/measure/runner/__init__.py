"""Real sglang workers in their PD roles, a role-aware load driver, and failure classification."""
