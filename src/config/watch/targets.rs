//! Where a file's changes show up: the file's own name, and, when it is a symlink (or sits in
//! a symlinked folder), every link on the way to what it finally names.
//!
//! A watch on the config's folder alone misses a config that is a symlink into another folder:
//! editing or replacing the target happens in the target's folder. Kubernetes' ConfigMap
//! mount is the case with a folder link (`gateway.toml -> ..data/gateway.toml`,
//! `..data -> ..2024_05_01...`), and swapping `..data` shows up in the config's own folder.
//! Each name on the chain is a point: its folder is watched and an event on it matters. The
//! chain is resolved again after every change, so that a swapped link is followed.

use std::path::{Path, PathBuf};

/// Links followed at most (the kernel's own limit for a path is 40).
const MAX_LINKS: usize = 40;

/// Every point of `file`, each a canonical folder joined with a name, in the order met: the
/// file, then the links it goes through. A file whose folder does not exist yet is its own
/// only point (made absolute).
pub fn points(file: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut push = |p: PathBuf| {
        if !out.contains(&p) {
            out.push(p);
        }
    };
    let mut path = absolute(file);
    for _ in 0..MAX_LINKS {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            break;
        };
        // Linked folders on the way: swapping one changes what `path` names.
        for dir in parent.ancestors() {
            let linked = std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink());
            if let (true, Some(up), Some(dir_name)) = (linked, dir.parent(), dir.file_name()) {
                if let Ok(up) = std::fs::canonicalize(up) {
                    push(up.join(dir_name));
                }
            }
        }
        let Ok(folder) = std::fs::canonicalize(parent) else {
            push(path.clone());
            break;
        };
        let here = folder.join(name);
        push(here.clone());
        match std::fs::read_link(&here) {
            Ok(target) => path = folder.join(target),
            Err(_) => break,
        }
    }
    out
}

fn absolute(file: &Path) -> PathBuf {
    if file.is_absolute() {
        file.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(file))
            .unwrap_or_else(|_| file.to_path_buf())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn a_plain_file_is_its_own_point() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().canonicalize().unwrap();
        std::fs::write(dir.join("gateway.toml"), "").unwrap();
        assert_eq!(
            points(&dir.join("gateway.toml")),
            [dir.join("gateway.toml")]
        );
        // Not there yet: still watched by name.
        assert_eq!(points(&dir.join("later.toml")), [dir.join("later.toml")]);
    }

    #[test]
    fn links_into_other_folders_are_followed_link_by_link() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().canonicalize().unwrap();
        for f in ["etc", "links", "data"] {
            std::fs::create_dir(root.join(f)).unwrap();
        }
        std::fs::write(root.join("data/real.toml"), "").unwrap();
        // A relative link, then an absolute one.
        symlink("../data/real.toml", root.join("links/link.toml")).unwrap();
        symlink(root.join("links/link.toml"), root.join("etc/gateway.toml")).unwrap();
        assert_eq!(
            points(&root.join("etc/gateway.toml")),
            [
                root.join("etc/gateway.toml"),
                root.join("links/link.toml"),
                root.join("data/real.toml"),
            ]
        );
    }

    #[test]
    fn a_kubernetes_configmap_mount_watches_the_data_link() {
        let d = tempfile::tempdir().unwrap();
        let mount = d.path().canonicalize().unwrap();
        std::fs::create_dir(mount.join("..2024_05_01_1")).unwrap();
        std::fs::write(mount.join("..2024_05_01_1/gateway.toml"), "").unwrap();
        symlink("..2024_05_01_1", mount.join("..data")).unwrap();
        symlink("..data/gateway.toml", mount.join("gateway.toml")).unwrap();
        assert_eq!(
            points(&mount.join("gateway.toml")),
            [
                mount.join("gateway.toml"),
                mount.join("..data"),
                mount.join("..2024_05_01_1/gateway.toml"),
            ]
        );
    }

    #[test]
    fn a_link_loop_ends() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().canonicalize().unwrap();
        symlink("b", dir.join("a")).unwrap();
        symlink("a", dir.join("b")).unwrap();
        assert_eq!(points(&dir.join("a")), [dir.join("a"), dir.join("b")]);
    }
}
