"""gpumnn inside other people's frameworks: :mod:`gpumnn.integrations.ray` (Ray Data's
``map_batches``). Each module imports its framework only where it needs it."""
