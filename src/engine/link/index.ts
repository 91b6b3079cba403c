export { loadSecretKey, type VcsCredential, VcsTokenStore } from "./vcs-token";
