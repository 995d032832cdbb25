"""The three roles of split federated learning, the messages they exchange, their hosts, optimizers and batching."""
