"""adaptplan: plan and run split federated learning."""
