//! Unit tests of the image processor.
