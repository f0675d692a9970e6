//! The `reconciled` server binary.

fn main() {
    println!("reconciled");
}
