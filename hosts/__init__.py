"""What runs on a worker host: gradient traces, quantizer, lane packing, the agent."""
