"""The policy network: one decoder definition (`transformer`), its layers and its config."""
