"""SASE sequence engine over out-of-order streams (Li et al. 2007; Li 2010 ch. 4)."""
