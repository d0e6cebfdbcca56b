int next_value(void) { return 2; }
