"""What the machine is: GPU name to profile mapping, peak tables, compute capability, and detection of the device
a run trains on. Above config (its rules name the keys), below everything that plans or measures a run."""
