"""A package of ops of one's own, laid out as framefuse/plugins/ is (README, "Adding an op"):
`framefuse.plugins.registry.add_op_package("toy_ops")` finds its op folders."""
