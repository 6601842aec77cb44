"""Models: the zoo, the user's files and builders, saving and loading, training."""
