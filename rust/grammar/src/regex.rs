// Placeholder until the pattern compiler lands.
