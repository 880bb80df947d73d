//! FUSE frontend: maps file-system requests of the kernel onto hybrid objects of the engine.
